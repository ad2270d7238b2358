"""Pre-flight reads the model folders under the model roots, and the secret store's names."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.hostrows import host_reported
from tests.models import write_model
from tests.specs import spec
from web.deploy import checks
from web.deployments import services
from web.deployments.models import Deployment
from web.deployments.services.modelfiles import model_folder
from web.fleet.models import FleetHost

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(tmp_path: Path, settings):  # type: ignore[no-untyped-def]
    settings.MODEL_ROOTS = [str(tmp_path)]
    return tmp_path


def _preflight(data: dict) -> list[dict[str, str]]:  # type: ignore[type-arg]
    _, findings = checks.deployment_validate(data=data)
    return [f.to_dict() for f in findings]


def _errors(data: dict) -> dict[str, list[str]]:  # type: ignore[type-arg]
    with pytest.raises(services.DeploymentInputError) as caught:
        checks.deployment_validate(data=data)
    return caught.value.errors


def test_it_sums_the_weight_files_of_a_folder_under_the_root(root: Path) -> None:
    folder = write_model(root / "Qwen3-8B")
    (folder / "model-00002.safetensors").write_bytes(b"\0" * 1000)
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 500)
    (folder / "tokenizer.json").write_text("{}")
    found = model_folder("/models/Qwen3-8B")
    assert found.exists and found.has_config and found.weight_files == 3
    assert found.weights_bytes == sum(p.stat().st_size for p in folder.iterdir()
                                      if p.suffix in (".safetensors", ".bin"))


def test_a_symlink_out_of_the_root_is_not_followed(root: Path, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    outside = write_model(tmp_path_factory.mktemp("elsewhere") / "secret-model")
    os.symlink(outside, root / "escape")
    assert not model_folder("/models/escape").exists
    assert not model_folder("/models/../etc").mounted


def test_a_model_or_drafter_path_outside_the_models_folder_is_refused_naming_the_field(root: Path, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    write_model(root / "Kimi-K2.6")
    outside = write_model(tmp_path_factory.mktemp("elsewhere") / "drafter")
    os.symlink(outside, root / "linked-drafter")
    for path in ("/etc", "/models/../etc"):
        errors = _errors(spec(engine__model_path=path))
        assert any("is outside /models" in m for m in errors["engine.model_path"]), errors
    errors = _errors(spec(engine__speculative_draft_model_path="/models/linked-drafter"))
    assert any("resolves outside /models: a symlink leads out" in m
               for m in errors["engine.speculative_draft_model_path"]), errors


def test_a_typo_in_the_model_path_is_refused_naming_the_field_and_the_folder(root: Path) -> None:
    write_model(root / "Kimi-K2.6")
    write_model(root / "Kimi-K2.6-DFlash")
    errors = _errors(spec(engine__model_path="/models/Kimi-K2.7-typo"))
    [message] = errors["engine.model_path"]
    assert "no folder '/models/Kimi-K2.7-typo'" in message
    assert "did you mean /models/Kimi-K2.6" in message and "[model-path-missing]" in message
    assert Deployment.objects.count() == 0


def test_a_drafter_without_weights_is_refused(root: Path) -> None:
    write_model(root / "Kimi-K2.6")
    (root / "Kimi-K2.6-DFlash").mkdir()
    (root / "Kimi-K2.6-DFlash" / "config.json").write_text("{}")
    [message] = _errors(spec())["engine.speculative_draft_model_path"]
    assert "[model-weights-missing]" in message


def test_a_good_spec_shows_both_folders_sizes_in_its_preflight() -> None:
    found = {f["field"]: f for f in _preflight(spec()) if f["rule"] == "model-files"}
    assert set(found) == {"engine.model_path", "engine.speculative_draft_model_path"}
    assert "config.json and 1 weight files, 0.00 GB" in found["engine.model_path"]["message"]


def test_a_declared_secret_missing_from_the_store_is_refused_before_anything_starts(
        tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.ENGINE_SECRETS_DIR = str(tmp_path)
    [message] = _errors(spec(secrets=["HF_TOKEN"]))["secrets"]
    assert "./engine-secrets/HF_TOKEN" in message and "[secret-missing]" in message
    (tmp_path / "HF_TOKEN").write_text("hf_x")
    assert not [f for f in _preflight(spec(secrets=["HF_TOKEN"])) if f["severity"] == "error"]


def test_the_agents_report_of_its_store_is_what_counts(tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    """The agent reads the store (compose mounts it there alone): its names decide."""
    settings.ENGINE_SECRETS_DIR = str(tmp_path)
    (tmp_path / "HF_TOKEN").write_text("hf_x")  # this process sees one; the agent does not
    host_reported(name="gpu-host", agent_id="agent@gpu-host", heartbeat_at=timezone.now(),
                  docker={"nvidia": True}, secret_names=["WANDB_KEY"])
    assert "secrets" in _errors(spec(secrets=["HF_TOKEN"]))
    _preflight(spec(secrets=["WANDB_KEY"]))
    # A report gone stale says nothing about the store now: this process's view counts.
    FleetHost.objects.update(heartbeat_at=timezone.now() - timedelta(hours=1))
    _preflight(spec(secrets=["HF_TOKEN"]))
