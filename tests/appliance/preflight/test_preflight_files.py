"""The file rules: model folders and declared secrets, from what the file system shows."""

from __future__ import annotations

import dataclasses

from appliance.preflight import Finding, ModelFolder
from tests.appliance.preflight.preflight_cases import check, make_spec

TARGET, DRAFTER = "engine.model_path", "engine.speculative_draft_model_path"
GOOD = ModelFolder(path="/models/Kimi-K2.6", mounted=True, exists=True, has_config=True,
                   weight_files=64, weights_bytes=595_000_000_000)


def _findings(folders: dict[str, ModelFolder] | None = None, secrets: list[str] | None = None,
              names: frozenset[str] | None = None) -> list[Finding]:
    spec = dataclasses.replace(make_spec(), secrets=secrets or [])
    return check(spec, model_folders=folders, secret_names=names)


def _by_rule(found: list[Finding], prefix: str) -> list[Finding]:
    return [f for f in found if f.rule.startswith(prefix)]


def test_a_good_folder_is_an_info_with_its_weights_summed() -> None:
    [info] = _by_rule(_findings({TARGET: GOOD}), "model-")
    assert (info.rule, info.severity, info.field) == ("model-files", "info", TARGET)
    assert "64 weight files, 595.00 GB" in info.message


def test_a_typo_is_an_error_naming_the_field_and_the_folder_it_meant() -> None:
    typo = ModelFolder(path="/models/Kimi-K2.7-typo", mounted=True, exists=False,
                       siblings=("Kimi-K2.6", "Kimi-K2.6-DFlash", "Qwen3-8B"))
    [error] = _by_rule(_findings({TARGET: typo}), "model-")
    assert (error.rule, error.severity, error.field) == ("model-path-missing", "error", TARGET)
    assert "/models/Kimi-K2.7-typo" in error.message
    assert "did you mean /models/Kimi-K2.6" in error.fix and "APPLIANCE_MODELS_DIR" in error.fix


def test_a_path_outside_the_models_mount_is_an_error() -> None:
    outside = ModelFolder(path="/data/kimi", mounted=False, exists=False)
    [error] = _by_rule(_findings({DRAFTER: outside}), "model-")
    assert (error.rule, error.field) == ("model-path-outside-models", DRAFTER)
    assert "/models/<folder>" in error.fix and "the drafter" in error.fix


def test_a_folder_without_config_or_weights_is_an_error_each() -> None:
    no_config = ModelFolder(path="/models/a", mounted=True, exists=True, weight_files=1)
    no_weights = ModelFolder(path="/models/b", mounted=True, exists=True, has_config=True)
    found = _by_rule(_findings({TARGET: no_config, DRAFTER: no_weights}), "model-")
    assert [(f.rule, f.field, f.severity) for f in found] == [
        ("model-config-missing", TARGET, "error"), ("model-weights-missing", DRAFTER, "error")]
    assert "*.safetensors or *.bin" in found[1].message


def test_the_file_rules_stay_quiet_without_facts() -> None:
    found = _findings(None, secrets=["HF_TOKEN"], names=None)
    assert not _by_rule(found, "model-") and not _by_rule(found, "secret-missing")


def test_a_declared_secret_missing_from_the_store_names_the_host_file() -> None:
    found = _by_rule(_findings(secrets=["HF_TOKEN", "WANDB_KEY"],
                               names=frozenset({"WANDB_KEY"})), "secret-missing")
    assert [(f.severity, f.field) for f in found] == [("error", "secrets")]
    assert "HF_TOKEN" in found[0].message and "WANDB_KEY" not in found[0].message
    # The host's path, where a person puts the file, not the container's.
    assert "./engine-secrets/HF_TOKEN" in found[0].fix and "/run/" not in found[0].fix


def test_a_declared_secret_in_the_store_passes() -> None:
    assert not _by_rule(_findings(secrets=["HF_TOKEN"], names=frozenset({"HF_TOKEN"})),
                        "secret-missing")
