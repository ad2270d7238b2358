"""The second round of real-engine recordings (433c58ed7, one H200, the rig's round2 runs in
tests/gpu/realengine/runs.py) read right: each failure named with a fix that names the field
and quotes the value, each warning a finding, the graphs-off run's eager decoding a note.

The rig records these runs; a run not recorded yet is skipped, saying so."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.logs.causes import CAUSES
from appliance.logs.diagnosis import diagnose
from appliance.logs.stamps import without_docker_stamps
from tests import real_engine as rec
from tests.appliance.runtime.test_metrics_real_engine import replay


def _needs(run: str) -> None:
    if not (rec.folder(run) / "engine.log").exists():
        pytest.skip(f"the rig has not recorded {run} yet (tests/gpu/realengine/runs.py)")


def _diagnosis(run: str) -> Any:
    with open(rec.folder(run) / "engine.log", encoding="utf-8", newline="\n") as log:
        return diagnose(without_docker_stamps(log))


def _argv_value(run: str, flag: str) -> str:
    argv = rec.run_info(run)["argv"]
    return str(argv[argv.index(flag) + 1])


def _findings(run: str) -> dict[str, dict[str, Any]]:
    return {d["cause"]: d for d in rec.of_kind(run, "diagnosis") if d.get("severity")}


def test_the_missing_drafter_is_named_with_its_field_and_path() -> None:
    _needs("drafter_missing")
    found = _diagnosis("drafter_missing")
    path = _argv_value("drafter_missing", "--speculative-draft-model-path")
    assert found is not None and found.cause == "drafter-not-found"
    assert found.evidence["path"] == path
    assert repr(path) in found.fix and "engine.speculative_draft_model_path" in found.fix
    assert "engine.model_path" not in found.fix


def test_tp2_with_one_visible_gpu_names_tp_size_and_the_visible_count() -> None:
    _needs("tp2_one_gpu")
    found = _diagnosis("tp2_one_gpu")
    assert found is not None and found.cause == "fewer-gpus-visible"
    assert found.evidence["tp_size"] == 2 and found.evidence["visible_at_most"] == 1
    assert "engine.tp_size" in found.fix and "gpus" in found.fix


def test_dflash_at_4_on_a_block_8_drafter_is_a_warning_finding_and_serves() -> None:
    _needs("dflash_block4")
    finding = _findings("dflash_block4")["dflash-block-size-mismatch"]
    assert finding["severity"] == "warning"
    assert (finding["evidence"]["used"], finding["evidence"]["drafter"]) == ("4", "8")
    assert finding["patch"] == {"engine.speculative_num_draft_tokens": 8}
    assert _diagnosis("dflash_block4") is None
    assert rec.of_kind("dflash_block4", "ready")


def test_graphs_off_by_the_spec_is_a_note_and_no_silent_eager() -> None:
    _needs("ddtree_nograph")
    causes = {d["cause"] for d in rec.of_kind("ddtree_nograph", "diagnosis")}
    assert "cuda-graphs-disabled" in causes and "silent-eager-verify" not in causes
    assert _findings("ddtree_nograph")["cuda-graphs-disabled"]["severity"] == "info"
    assert _diagnosis("ddtree_nograph") is None


def test_the_graphs_off_runs_alerts_are_the_note_only() -> None:
    _needs("ddtree_nograph")
    raised = [(a.id, a.severity) for a in replay("ddtree_nograph").raised]
    assert raised == [("eager-by-spec", "info")]


def test_the_graphs_off_notes_speed_cost_is_the_recordings() -> None:
    _needs("ddtree_nograph")

    def tpot_at_one(run: str) -> float:
        levels = [lvl for row in rec.json_file(run, "bench.json") for lvl in row["json"]["levels"]]
        return float(next(lvl for lvl in levels if lvl["concurrency"] == 1)["tpot_ms"]["p50"])

    fix = CAUSES["cuda-graphs-disabled"].fix
    assert f"{tpot_at_one('ddtree_nograph'):.2f} ms per output token" in fix
    assert f"against {tpot_at_one('ddtree_triton'):.2f} ms" in fix


def test_batches_above_cuda_graph_max_bs_under_load_are_eager_by_design() -> None:
    _needs("ddtree_bs4_load")
    findings = _findings("ddtree_bs4_load")
    above = findings["eager-above-max-bs"]
    assert above["severity"] == "info" and above["evidence"]["max_captured_bs"] == 4
    assert above["evidence"]["running_req"] > 4
    causes = {d["cause"] for d in rec.of_kind("ddtree_bs4_load", "diagnosis")}
    assert "silent-eager-verify" not in causes


def test_the_tp2_recording_with_the_specs_gpus_says_which_to_change() -> None:
    _needs("tp2_one_gpu")
    with open(rec.folder("tp2_one_gpu") / "engine.log", encoding="utf-8", newline="\n") as log:
        lines = list(without_docker_stamps(log))
    short = diagnose(lines, {"gpus": [0], "tp_size": 2})
    assert short is not None and "(spec key gpus), now [0]" in short.fix
    listed = diagnose(lines, {"gpus": [0, 1], "tp_size": 2})  # the rig's spec: [0, 1]
    assert listed is not None and "NVIDIA runtime" in listed.fix and "now [0, 1]" in listed.fix
    assert listed.evidence["container_cuda_visible_devices"] is None
