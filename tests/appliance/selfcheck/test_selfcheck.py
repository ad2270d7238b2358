"""The GPU self-check as the worker sees it: the real H200 `--stream` output (fixtures
recorded by tests/gpu/run-on-gpu-host.sh) parsed into events and a diagnosis, the
arguments a deployment gives the check, and the test engine's stand-in held to the real
check's line format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from appliance import selfcheck as gpucheck
from appliance.engine.spec import SpecError, spec_from_dict
from appliance.logs.diagnosis import diagnose
from appliance.logs.parser import parse_lines
from appliance.preflight import gpu_check_args
from tests.specs import spec

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "selfcheck"
STAND_IN = ROOT / "docker" / "test-engine" / "gpucheck.py"
BEGIN, END_OK = "appliance: GPU self-check begin", "appliance: GPU self-check end rc=0"


def _lines(name: str) -> list[str]:
    return (FIXTURES / f"{name}.stream").read_text().splitlines()


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in parse_lines(lines)]


def test_the_real_h200_stream_becomes_begin_gpus_checks_and_a_passing_report() -> None:
    events = _events([BEGIN, *_lines("h200_selfcheck_ddtree_ok"), END_OK])
    kinds = [e["kind"] for e in events]
    assert kinds == ["selfcheck_start", "selfcheck_begin", "selfcheck_gpus",
                     *["selfcheck_check"] * 5, "selfcheck_report", "selfcheck_exit"]
    begin = events[1]
    assert {r["role"]: r["width"] for r in begin["roles"]} == {"target_verify": 33, "draft": 8}
    assert events[2]["gpus"][0]["name"] == "NVIDIA H200"
    assert events[2]["driver_version"] == "580.159.04"
    report = events[-2]
    assert report["ok"] is True and report["elapsed_s"] > 0
    assert [g["width"] for g in report["graphs"]] == [33, 8]
    assert all(g["replay_ms"] < g["eager_ms"] for g in report["graphs"])
    assert diagnose([BEGIN, *_lines("h200_selfcheck_ddtree_ok"), END_OK]) is None


def test_a_real_failed_check_is_a_fatal_diagnosis_naming_the_check_and_its_fix() -> None:
    lines = [BEGIN, *_lines("h200_selfcheck_gpu_missing"), "appliance: GPU self-check end rc=1"]
    found = [e for e in _events(lines) if e["kind"] == "diagnosis"]
    assert len(found) == 1 and found[0]["fatal"] is True
    assert found[0]["cause"] == "gpu-selfcheck-failed"
    assert "nvml-inventory: NVML could not read the GPUs: GPU 1 requested but NVML sees 1 " \
           "GPU(s) (and 1 more failed check(s))" in found[0]["summary"]
    assert "--gpus" in found[0]["fix"]
    assert [f["id"] for f in found[0]["evidence"]["failed"]] == ["nvml-inventory", "gpus-visible"]
    diagnosis = diagnose(lines)
    assert diagnosis is not None and diagnosis.cause == "gpu-selfcheck-failed"


def test_a_check_that_dies_without_a_report_is_diagnosed_from_its_exit_status() -> None:
    lines = [BEGIN, _lines("h200_selfcheck_ddtree_ok")[0], "Segmentation fault (core dumped)",
             "appliance: GPU self-check end rc=139"]
    diagnosis = diagnose(lines)
    assert diagnosis is not None and diagnosis.cause == "gpu-selfcheck-failed"
    assert "exited with code 139 before printing its report" in diagnosis.summary
    assert diagnose([BEGIN, *_lines("h200_selfcheck_ddtree_ok"), END_OK]) is None


def test_lines_that_only_look_like_the_check_are_not_events() -> None:
    events = _events(["gpu-check: OK in 3 s", "gpu-check: {not json", 'gpu-check: {"x": 1}'])
    assert events == []


def _keys_by_kind(lines: list[str]) -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    for line in lines:
        event = gpucheck.parse_stream_line(line)
        assert event is not None, line
        keys.setdefault(event["event"], set()).update(event)
    return keys


def test_the_test_engine_stand_in_prints_the_real_checks_line_format() -> None:
    argv = [sys.executable, str(STAND_IN), "--stream", "--gpus", "0", "--algorithm", "DDTREE",
            "--block-size", "8", "--budget", "32", "--max-bs", "4"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={"TEST_ENGINE_PACE_S": "0"})
    assert done.returncode == 0, done.stderr
    stand_in = _keys_by_kind(done.stdout.splitlines())
    real = _keys_by_kind(_lines("h200_selfcheck_ddtree_ok"))
    assert stand_in == real
    stand_in_begin = gpucheck.parse_stream_line(done.stdout.splitlines()[0])
    real_begin = gpucheck.parse_stream_line(_lines("h200_selfcheck_ddtree_ok")[0])
    assert stand_in_begin == real_begin  # same GPUs, roles, widths and masks for these args


def _spec(**changes: Any) -> Any:
    return spec_from_dict(spec(**changes))


def test_a_ddtree_deployment_checks_budget_plus_one_and_block_widths_on_its_gpus() -> None:
    args = gpu_check_args(_spec(gpus=[4, 5, 6, 7], engine__tp_size=4))
    assert args == ["--gpus", "0,1,2,3", "--algorithm", "DDTREE", "--block-size", "8",
                    "--budget", "32", "--max-bs", "8"]
    roles = gpucheck.roles_from_args(gpucheck.build_parser().parse_args(args))
    assert [(r.role, r.width) for r in roles] == [("target_verify", 33), ("draft", 8)]


def test_without_a_known_block_size_the_graph_checks_are_skipped_not_guessed() -> None:
    args = gpu_check_args(_spec(engine__speculative_algorithm="DFLASH",
                                engine__speculative_num_draft_tokens=None,
                                engine__speculative_ddtree_budget=None,
                                engine__speculative_draft_model_path="/nowhere"))
    assert "--skip-graphs" in args and "--algorithm" not in args


def test_cuda_graph_max_bs_below_eight_caps_the_checked_batch_sizes() -> None:
    args = gpu_check_args(_spec(engine__cuda_graph_max_bs=2, engine__speculative_algorithm="NONE"))
    assert args[-2:] == ["--max-bs", "2"] and args[2:4] == ["--algorithm", "NONE"]


def test_self_check_must_be_a_boolean() -> None:
    with pytest.raises(SpecError) as error:
        spec_from_dict(spec(self_check="yes"))
    assert [e.field for e in error.value.errors] == ["self_check"]
    assert spec_from_dict(spec()).self_check is True
    assert spec_from_dict(spec(self_check=False)).self_check is False


def test_the_real_two_h200_stream_carries_peer_access_nvlink_and_the_bus_bandwidth() -> None:
    events = _events(_lines("h200x2_selfcheck_ddtree_ok"))
    checks = {e["id"]: e for e in events if e["kind"] == "selfcheck_check"}
    assert checks["peer-access"]["ok"] and checks["allreduce"]["ok"]
    report = events[-1]
    assert report["kind"] == "selfcheck_report" and report["ok"] is True
    assert report["topology"]["matrix"] == [["X", "NV18"], ["NV18", "X"]]
    allreduce = report["allreduce"]
    assert allreduce["world_size"] == 2 and allreduce["busbw_gbps"] > 100
    assert allreduce["busbw_gbps"] == gpucheck.bus_bandwidth(allreduce["algbw_gbps"], 2)
