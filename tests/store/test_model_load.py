"""Deployments and the model store: pre-flight on store entries, the expected load time from
the root's measured read rate, the wait for a download, and what is mounted into an engine.

The models are real folders under a real root (scanned by the store into real entries);
the read rate is measured on them; a download still running is an entry in that state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from appliance.runtime.remote_agent import remote_plan
from tests.models import write_model
from tests.plans import own_host_placement, own_host_settings
from tests.specs import spec
from web.deploy import checks
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, EventKind, RootReadRate
from web.deployments.services.installation import instance_id
from web.store.loadtime import (
    deployment_model_wait,
    root_read_rate_measure,
)
from web.store.models import ModelEntry, ModelState
from web.store.services.scan import model_store_scan

pytestmark = pytest.mark.django_db
MIB = 1024**2


@pytest.fixture
def root(tmp_path: Path, settings):  # type: ignore[no-untyped-def]
    """A root holding a 4 MiB target and a drafter; the store has scanned it."""
    settings.MODEL_ROOTS = [str(tmp_path)]
    target = write_model(tmp_path / "Kimi-K2.6", {"architectures": ["DeepseekV3ForCausalLM"],
                                                  "model_type": "kimi_k2", "kv_lora_rank": 512})
    (target / "model.safetensors").unlink()
    (target / "model-00001-of-00001.safetensors").write_bytes(_safetensors(MIB))
    write_model(tmp_path / "Kimi-K2.6-DFlash", {"architectures": ["DFlashDraftModel"],
                                                "model_type": "qwen3"})
    model_store_scan()
    return tmp_path


def _safetensors(values: int) -> bytes:
    from tests.models import safetensors_bytes

    return safetensors_bytes(values)


def _entry(name: str) -> ModelEntry:
    return ModelEntry.objects.get(relative_path=name)


def _findings(deployment: Deployment, rule: str) -> list[dict[str, str]]:
    return [f for f in deployment.preflight if f["rule"] == rule]


def test_the_store_scanned_the_roots_real_folders_as_ready(root: Path) -> None:
    assert {e.relative_path: e.state for e in ModelEntry.objects.all()} == {
        "Kimi-K2.6": ModelState.READY, "Kimi-K2.6-DFlash": ModelState.READY}


def test_a_roots_read_rate_is_measured_on_its_weight_files_and_kept(root: Path) -> None:
    row = root_read_rate_measure(root=str(root))
    assert row.bytes_read == sum(p.stat().st_size for p in root.rglob("*.safetensors"))
    assert row.gbps > 0 and row.method == "o_direct"
    again = root_read_rate_measure(root=str(root))
    assert RootReadRate.objects.count() == 1 and again.measured_at >= row.measured_at


def test_a_deployment_carries_its_expected_load_from_size_and_the_roots_rate(root: Path) -> None:
    rate = root_read_rate_measure(root=str(root))
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    size = _entry("Kimi-K2.6").size_bytes  # the store's entry: every file of the folder
    assert size >= (root / "Kimi-K2.6" / "model-00001-of-00001.safetensors").stat().st_size
    weights = deployment.load_estimate["weights"]
    assert weights["bytes"] == size and weights["read_gbps"] == rate.gbps
    assert weights["expected_s"] == pytest.approx(size / 1e9 / rate.gbps)
    [target] = [f for f in _findings(deployment, "load-time")
                if f["field"] == "engine.model_path"]
    assert f"at {rate.gbps:.2f} GB/s" in target["message"]
    assert "measured sequential read rate" in target["message"]


def test_an_unmeasured_root_is_said_so_and_the_store_measures_it(root: Path) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    [target] = [f for f in _findings(deployment, "load-time")
                if f["field"] == "engine.model_path"]
    assert "not measured" in target["message"]
    assert deployment.load_estimate["weights"]["read_gbps"] is None


def test_a_partial_model_is_refused_naming_the_field(root: Path) -> None:
    # Cut the drafter's weights short: the scan finds the file shorter than its header says.
    shard = root / "Kimi-K2.6-DFlash" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    model_store_scan()
    assert _entry("Kimi-K2.6-DFlash").state == ModelState.PARTIAL
    with pytest.raises(services.DeploymentInputError) as caught:
        checks.deployment_validate(data=spec())
    [message] = caught.value.errors["engine.speculative_draft_model_path"]
    assert "is partial in the model store" in message and "[model-not-ready]" in message


def test_a_failed_download_is_refused_with_its_error(root: Path) -> None:
    ModelEntry.objects.filter(relative_path="Kimi-K2.6").update(
        state=ModelState.FAILED, error="sha256 of model-00001-of-00001.safetensors differs")
    with pytest.raises(services.DeploymentInputError) as caught:
        checks.deployment_validate(data=spec())
    [message] = caught.value.errors["engine.model_path"]
    assert "failed in the model store: sha256 of model-00001-of-00001.safetensors" in message


def test_a_folder_in_a_root_the_store_has_not_listed_is_reported_unverified(root: Path) -> None:
    write_model(root / "fresh")
    _, findings = checks.deployment_validate(data=spec(engine__model_path="/models/fresh"))
    [info] = [f for f in findings if f.rule == "model-unverified"]
    assert info.field == "engine.model_path" and info.severity == "info"


def _downloading(name: str, done: int = 256 * MIB, size: int = 1024 * MIB) -> None:
    ModelEntry.objects.filter(relative_path=name).update(
        state=ModelState.DOWNLOADING, bytes_done=done, size_bytes=size)


def test_a_downloading_model_waits_with_its_progress_instead_of_starting(root: Path) -> None:
    (root / "Kimi-K2.6" / "config.json").unlink()  # not there yet mid-download
    _downloading("Kimi-K2.6")
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    assert "still downloading (25 %" in _findings(deployment, "model-downloading")[0]["message"]
    assert deployment_model_wait(deployment_id=deployment.pk) == "waiting"
    deployment.refresh_from_db()
    assert (deployment.status, deployment.phase) == ("queued", "model_download")
    assert deployment.progress["model_download"] == {
        "path": "/models/Kimi-K2.6", "entry_id": _entry("Kimi-K2.6").pk,
        "state": "downloading", "bytes_done": 256 * MIB, "size_bytes": 1024 * MIB,
        "rate_bps": 0.0}
    [event] = deployment.events.filter(kind=EventKind.PROGRESS)
    assert event.payload["kind"] == "model_download"
    # The same state and percent again writes no second event; a new percent does.
    deployment_model_wait(deployment_id=deployment.pk)
    _downloading("Kimi-K2.6", done=512 * MIB)
    deployment_model_wait(deployment_id=deployment.pk)
    assert deployment.events.filter(kind=EventKind.PROGRESS).count() == 2


def test_a_verified_download_lets_the_deployment_go_on(root: Path) -> None:
    _downloading("Kimi-K2.6")
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    deployment_model_wait(deployment_id=deployment.pk)
    ModelEntry.objects.filter(relative_path="Kimi-K2.6").update(state=ModelState.READY)
    assert deployment_model_wait(deployment_id=deployment.pk) == "ready"
    deployment.refresh_from_db()
    assert deployment.progress["model_download"]["state"] == "ready"
    assert deployment.load_estimate["weights"]["bytes"] == 1024 * MIB


def test_a_download_that_fails_while_waiting_fails_the_deployment_clearly(root: Path) -> None:
    _downloading("Kimi-K2.6-DFlash")
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    ModelEntry.objects.filter(relative_path="Kimi-K2.6-DFlash").update(
        state=ModelState.CANCELLED)
    assert deployment_model_wait(deployment_id=deployment.pk) == "failed"
    deployment.refresh_from_db()
    assert deployment.status == "failed"
    assert deployment.diagnosis["cause"] == "model-download-failed"
    assert "/models/Kimi-K2.6-DFlash is cancelled" in deployment.diagnosis["summary"]


def test_an_unverified_model_is_never_mounted_and_the_others_are_mounted_alone(
        root: Path) -> None:
    write_model(root / "half-downloaded")
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    # The agent's models directory: its environment's APPLIANCE_MODELS_DIR.
    placement = own_host_placement(deployment, "img")
    assert placement["models_refused"] == []
    plan = remote_plan(placement, own_host_settings(APPLIANCE_MODELS_DIR="/srv/models"),
                       instance_id())
    assert plan.volumes == {
        "/srv/models/Kimi-K2.6": {"bind": "/models/Kimi-K2.6", "mode": "ro"},
        "/srv/models/Kimi-K2.6-DFlash": {"bind": "/models/Kimi-K2.6-DFlash", "mode": "ro"}}
    ModelEntry.objects.filter(relative_path="Kimi-K2.6").update(state=ModelState.PARTIAL)
    # The host API names what is refused; the agent fails the start with it before any
    # plan (tests/worker/test_model_wait.py), so nothing is mounted.
    assert own_host_placement(deployment, "img")["models_refused"] == [
        "/models/Kimi-K2.6 (partial)"]


def test_the_weights_card_shows_the_expected_load_then_the_rate_reached(
        root: Path, client: Client, admin) -> None:  # type: ignore[no-untyped-def]
    RootReadRate.objects.create(root=str(root), gbps=2.0, bytes_read=1, seconds=1.0,
                                method="o_direct", measured_at="2026-12-01T00:00:00Z")
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    client.force_login(admin)
    url = reverse("deployments:detail", args=[deployment.pk])
    page = client.get(url).content.decode()
    assert "expected load 0.0 s: 0.00 GB at the disk&#x27;s measured 2.00 GB/s" in page
    # The engine's own line, folded as the agent folds it (the real 433c58ed7 shape).
    size = deployment.load_estimate["weights"]["bytes"]
    progress = {"weights": {"finished": True, "elapsed_s": 0.001, "mem_usage_gb": 0.12,
                            "ranks": 1}}
    Deployment.objects.filter(pk=deployment.pk).update(progress=progress)
    page = client.get(url).content.decode()
    gbps = size / 1e9 / 0.001
    assert f"read at {gbps:.2f} GB/s in 0.001 s: {100 * gbps / 2.0:.0f} % of the disk" in page


def test_a_deployment_names_its_models_by_store_entry(root: Path) -> None:
    data = spec()
    del data["engine"]["model_path"], data["engine"]["speculative_draft_model_path"]
    data.update(model_entry=_entry("Kimi-K2.6").pk, drafter_entry=str(_entry(
        "Kimi-K2.6-DFlash").pk))
    deployment = deploying.deployment_create(data=data, confirm_warnings=True)
    engine = deployment.spec["engine"]
    assert (engine["model_path"], engine["speculative_draft_model_path"]) == (
        "/models/Kimi-K2.6", "/models/Kimi-K2.6-DFlash")


def test_an_entry_the_store_does_not_have_is_refused_naming_the_field(root: Path) -> None:
    for bad in (999999, "x", True):
        with pytest.raises(services.DeploymentInputError) as caught:
            checks.deployment_validate(data={**spec(), "model_entry": bad})
        [message] = caught.value.errors["model_entry"]
        assert "No model store entry" in message and "give the path instead" in message
    assert Deployment.objects.count() == 0


FORM = {"name": "from-store", "recipe": "kimi-k2.6-ddtree", "algorithm": "DDTREE",
        "block_size": "8", "tree_budget": "32", "tp_size": "1", "gpu_ids": "0",
        "attention_backend": "fa3", "more_spec": "", "extra_args": "",
        "confirm_warnings": "on"}


def test_the_form_offers_the_stores_models_with_their_expected_load_and_deploys_one(
        root: Path, client: Client, admin) -> None:  # type: ignore[no-untyped-def]
    RootReadRate.objects.create(root=str(root), gbps=1.5, bytes_read=1, seconds=1.0,
                                method="o_direct", measured_at="2026-12-01T00:00:00Z")
    client.force_login(admin)
    url = reverse("deployments:new") + "?recipe=kimi-k2.6-ddtree"
    page = client.get(url).content.decode()
    target = _entry("Kimi-K2.6")
    label = (f"/models/Kimi-K2.6 (ready): {target.size_bytes / 1e9:.2f} GB of weights at "
             "1.50 GB/s: about 0.0 s to read")
    assert f'<option value="{target.pk}">{label}</option>' in page
    assert 'id="estimate-model_path"' in page and 'id="store-models"' in page
    drafter = _entry("Kimi-K2.6-DFlash")
    answer = client.post(url, {**FORM, "model_entry": str(target.pk),
                               "drafter_entry": str(drafter.pk)})
    assert answer.status_code == 302, answer.content.decode()[-3000:]
    deployment = Deployment.objects.get(name="from-store")
    assert deployment.spec["engine"]["model_path"] == "/models/Kimi-K2.6"
    assert deployment.load_estimate["weights"]["read_gbps"] == 1.5


def test_the_form_without_a_model_says_so_beside_the_path(
        root: Path, client: Client, admin) -> None:  # type: ignore[no-untyped-def]
    client.force_login(admin)
    answer = client.post(reverse("deployments:new"), {**FORM, "drafter_path":
                                                      "/models/Kimi-K2.6-DFlash"})
    assert answer.status_code == 400
    assert answer.context["form"].errors["model_path"]


def test_the_real_engines_load_lines_give_the_rate_it_reached() -> None:
    # The 433c58ed7 recording: "Load weight end. elapsed=0.26 s, type=DeepseekV3ForCausalLM,
    # ... mem usage=0.12 GB." (the target) folded as the agent folds it.
    from appliance.logs.parser import LogParser
    from appliance.runtime.progress import progress_fold
    from appliance.store.loadtime import load_report, load_text
    from tests import real_engine as rec

    progress: dict = {}  # type: ignore[type-arg]
    parser = LogParser()
    for line in rec.lines("ddtree_triton"):
        for event in parser.feed(line.text):
            progress_fold(progress, event.to_dict() | {"kind": event.kind})
    weights = progress["weights"]
    assert (weights["elapsed_s"], weights["mem_usage_gb"]) == (0.26, 0.12)
    # Without an estimate: the GiB the log says the rank put on its GPU, over its time.
    alone = load_report(estimate={}, progress=progress)["weights"]
    assert alone["gbps"] == round(0.12 * 2**30 / 1e9 / 0.26, 3)
    # With the checkpoint's size and its disk's rate: the share of that rate it reached.
    estimate = {"weights": {"bytes": 130_000_000, "read_gbps": 1.0, "expected_s": 0.13}}
    row = load_report(estimate=estimate, progress=progress)["weights"]
    assert (row["gbps"], row["share"]) == (0.5, 0.5)
    assert load_text(row) == ("read at 0.50 GB/s in 0.26 s: 50 % of the disk's measured "
                              "1.00 GB/s (expected 0.1 s)")
    # A piece of the load's bar read after its end line (the pieces come on a stream of
    # their own, in no order with the lines) leaves the finished load as it was.
    late = next(e for line in rec.lines("ddtree_triton") for e in LogParser().feed(line.text)
                if e.kind == "weights_progress")
    progress_fold(progress, late.to_dict() | {"kind": late.kind, "partial": True})
    assert progress["weights"]["finished"] and progress["weights"]["elapsed_s"] == 0.26


def test_the_store_page_shows_each_roots_read_rate_and_measures_one_on_request(
        root: Path, client: Client, operator) -> None:  # type: ignore[no-untyped-def]
    from worker import tasks

    client.force_login(operator)
    page = client.get(reverse("store:list")).content.decode()
    assert f'<tr data-root="{root}">' in page and "not measured" in page
    answer = client.post(reverse("deployments:read-rate"), {"root": str(root)}, follow=True)
    assert f"Measuring the read rate of {root}" in answer.content.decode()
    tasks.store_read_rate.apply(args=[str(root)]).get()  # what the worker runs on "models"
    row = RootReadRate.objects.get(root=str(root))
    page = client.get(reverse("store:list")).content.decode()
    assert f"{row.gbps:.2f} GB/s" in page and "o_direct" in page


def test_a_read_rate_of_a_folder_that_is_no_root_is_refused(
        root: Path, client: Client, operator, viewer) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    answer = client.post(reverse("deployments:read-rate"), {"root": "/etc"}, follow=True)
    assert "is not a model root (APPLIANCE_MODEL_ROOTS)" in answer.content.decode()
    assert not RootReadRate.objects.exists()
    client.force_login(viewer)
    assert client.post(reverse("deployments:read-rate"), {"root": str(root)}).status_code == 403
    assert "Measure</button>" not in client.get(reverse("store:list")).content.decode()


def test_mid_download_the_gpu_memory_check_counts_the_whole_model(root: Path) -> None:
    # 8 GiB per the store, a 4 MiB shard on disk so far: the weights rule uses the 8 GiB.
    _downloading("Kimi-K2.6", done=MIB, size=8 * 1024**3)
    from web.deployments.services.modelfiles import local_model_facts
    from web.store.loadtime import store_facts

    spec_ = checks.deployment_validate(data=spec())[0]
    facts = store_facts(spec_, local_model_facts(spec_))
    shard = root / "Kimi-K2.6" / "model-00001-of-00001.safetensors"
    assert local_model_facts(spec_)["weights_bytes"] == shard.stat().st_size
    assert facts["weights_bytes"] == 8 * 1024**3


def test_the_api_deploys_by_store_entry_and_gives_the_expected_load(
        root: Path, client: Client, operator) -> None:  # type: ignore[no-untyped-def]
    rate = root_read_rate_measure(root=str(root))
    data = spec()
    del data["engine"]["model_path"]
    client.force_login(operator)
    answer = client.post("/api/deployments/", {"spec": {**data, "model_entry": _entry(
        "Kimi-K2.6").pk}, "confirm_warnings": True}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["spec"]["engine"]["model_path"] == "/models/Kimi-K2.6"
    assert body["load_estimate"]["weights"]["read_gbps"] == rate.gbps
    assert any(f["rule"] == "load-time" for f in body["preflight"])
    bad = client.post("/api/deployments/", {"spec": {**data, "model_entry": 424242}},
                      content_type="application/json")
    assert bad.status_code == 400 and "No model store entry" in bad.json()["model_entry"][0]
