"""Fix texts and patches of the failure catalogue (appliance/logs/catalogue.py: the engine's
causes.py, ddtree_causes.py, recorded_causes.py and the appliance's appliance_causes.py): a
fix names what a person can act on, and a one-setting fix is a patch."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.engine.spec import SpecError, spec_from_dict
from appliance.logs.catalogue import CATALOGUE
from appliance.logs.cause import spec_patched
from appliance.logs.diagnosis import diagnose
from tests.specs import spec

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


@pytest.mark.parametrize("cause", sorted(CATALOGUE))
def test_no_fix_names_an_action_that_does_not_exist_or_a_container_path(cause: str) -> None:
    fix = CATALOGUE[cause].fix
    assert "restart the deployment" not in fix.lower()
    assert "/run/secrets" not in fix
    assert "--ipc host" not in fix  # engines get their own IPC namespace (shm_size)


@pytest.mark.parametrize("cause", sorted(CATALOGUE))
def test_a_fix_naming_an_engine_key_says_where_to_set_it(cause: str) -> None:
    fix = CATALOGUE[cause].fix
    if "engine." not in fix:
        return
    assert "Extra engine arguments" in fix or "the form" in fix or "spec" in fix, fix


@pytest.mark.parametrize(("log", "patch"), [
    ("cuda_oom_capture.log", {"engine.cuda_graph_max_bs": 32}),  # captured at bs 64 when OOM
    ("nccl_shm.log", {"shm_size": "64g"}),
    ("trust_remote_code.log", {"engine.trust_remote_code": True}),
    ("flashinfer_mla_tree.log", {"engine.attention_backend": "fa3"}),
    ("dflash_dp_attention.log", {"engine.enable_dp_attention": False}),
    ("model_not_found.log", None),  # a path a person must fix
    ("driver_too_old.log", None),
])
def test_a_diagnosis_carries_its_fix_as_a_spec_patch_where_it_is_one_setting(
        log: str, patch: dict[str, object] | None) -> None:
    with open(LOGS / log, encoding="utf-8") as handle:
        found = diagnose(handle)
    assert found is not None and found.patch == patch
    if patch:
        assert found.to_dict()["patch"] == patch


@pytest.mark.parametrize("cause", sorted(c for c in CATALOGUE if CATALOGUE[c].patch))
def test_every_patch_gives_a_valid_spec(cause: str) -> None:
    patched = spec_patched(spec(), CATALOGUE[cause].patch or {})
    try:
        spec_from_dict(patched)
    except SpecError as exc:
        pytest.fail(f"{cause}'s patch makes an invalid spec: {exc}")


def test_a_patch_changes_only_its_keys_and_not_the_spec_it_was_given() -> None:
    original = spec()
    patched = spec_patched(original, {"engine.cuda_graph_max_bs": 32, "shm_size": "64g"})
    assert patched["engine"]["cuda_graph_max_bs"] == 32 and patched["shm_size"] == "64g"
    assert "cuda_graph_max_bs" not in original["engine"] and "shm_size" not in original
    assert {k: v for k, v in patched["engine"].items() if k != "cuda_graph_max_bs"} \
        == original["engine"]
