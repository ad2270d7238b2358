"""The GPU self-check on a real GPU: every visible GPU, DDTree widths, and the width fault."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from appliance import selfcheck as gpucheck

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "h200_width_mismatch.txt"
BLOCK, BUDGET = 8, 32


def _run_check(gpus: list[int]) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    argv = [sys.executable, "-m", "appliance.selfcheck", "--gpus", ",".join(map(str, gpus)),
            "--algorithm", "DDTREE", "--block-size", str(BLOCK), "--budget", str(BUDGET),
            "--max-bs", "4", "--json"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def report(cuda_count: int) -> dict[str, Any]:
    rc, data = _run_check(list(range(cuda_count)))
    data["_rc"] = rc
    return data


def test_the_check_passes_and_exits_zero_on_every_visible_gpu(report: dict[str, Any]) -> None:
    failed = [c for c in report["checks"] if not c["ok"]]
    assert report["ok"] and report["_rc"] == 0, failed


def test_it_lists_each_gpu_with_name_memory_and_uuid(report: dict[str, Any],
                                                     cuda_count: int) -> None:
    assert [g["index"] for g in report["gpus"]] == list(range(cuda_count))
    for gpu in report["gpus"]:
        assert gpu["name"] and gpu["uuid"].startswith(("GPU-", "MIG-"))
        assert 0 < gpu["memory_free_gb"] <= gpu["memory_total_gb"]
    assert gpucheck.check_driver(report["driver_version"]).ok
    assert report["cuda_driver_version"]


def test_the_topology_is_a_square_matrix_over_the_gpus(report: dict[str, Any],
                                                       cuda_count: int) -> None:
    matrix = report["topology"]["matrix"]
    assert len(matrix) == cuda_count and all(len(row) == cuda_count for row in matrix)
    assert all(matrix[i][i] == "X" for i in range(cuda_count))
    pairs = report["topology"].get("peer_access", [])
    assert len(pairs) == cuda_count * (cuda_count - 1)


def test_the_allreduce_spans_every_gpu_with_a_consistent_bus_bandwidth(
        report: dict[str, Any], cuda_count: int) -> None:
    ar = report["allreduce"]
    assert ar["ok"] and ar["world_size"] == cuda_count
    assert ar["algbw_gbps"] > 0
    expected = gpucheck.bus_bandwidth(ar["algbw_gbps"], cuda_count)
    assert ar["busbw_gbps"] == pytest.approx(expected, abs=0.02)


def test_graphs_are_captured_at_budget_plus_one_for_verify_and_block_for_draft(
        report: dict[str, Any]) -> None:
    widths = {g["role"]: g["width"] for g in report["graphs"]}
    assert widths == {"target_verify": BUDGET + 1, "draft": BLOCK}
    for graph in report["graphs"]:
        assert graph["ok"] and graph["bs"] == [1, 2, 4]
        assert graph["max_abs_err_vs_eager"] <= gpucheck.GRAPH_TOLERANCE
        assert graph["replay_ms"] > 0 and graph["eager_ms"] > 0


@pytest.mark.parametrize("bs", [1, 2])
def test_a_block_width_graph_fed_budget_plus_one_rows_raises_a_size_mismatch(bs: int) -> None:
    text = gpucheck.reproduce_width_mismatch(BLOCK, BUDGET + 1, bs)
    assert f"tensor a ({BLOCK * bs})" in text and f"tensor b ({(BUDGET + 1) * bs})" in text


def test_the_fixture_holds_the_error_real_torch_raises_today() -> None:
    live = gpucheck.reproduce_width_mismatch(BLOCK, BUDGET + 1, 1)
    assert live and live in FIXTURE.read_text()


def test_the_diagnosis_names_the_ddtree_verify_width_for_the_real_traceback() -> None:
    diagnosis = pytest.importorskip("appliance.logs.diagnosis")
    trace = gpucheck.width_mismatch_traceback(BLOCK, BUDGET + 1, 1)
    lines = ["[2026-01-01 00:00:00 TP0] Scheduler hit an exception: " + trace.splitlines()[0],
             *trace.splitlines()[1:]]
    found = diagnosis.diagnose(lines)
    assert found is not None and found.cause == "ddtree-verify-width", found


def test_the_stream_prints_each_check_as_it_happens_then_the_report(cuda_count: int) -> None:
    argv = [sys.executable, "-m", "appliance.selfcheck", "--gpus",
            ",".join(map(str, range(cuda_count))), "--algorithm", "DDTREE", "--block-size",
            str(BLOCK), "--budget", str(BUDGET), "--stream"]
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, "NCCL_NVLS_ENABLE": "0"},
                          capture_output=True, text=True, timeout=280)
    events = [gpucheck.parse_stream_line(line) for line in done.stdout.splitlines()]
    assert all(events), done.stdout
    kinds = [e["event"] for e in events if e]
    assert kinds[0] == "begin" and kinds[-1] == "report" and "gpus" in kinds
    report = events[-1]
    assert report is not None and report["ok"] and done.returncode == 0
    streamed = [{k: e[k] for k in ("id", "ok", "message", "fix")}
                for e in events if e and e["event"] == "check"]
    assert streamed == report["checks"]
    allreduce = next(c for c in streamed if c["id"] == "allreduce")
    if cuda_count == 1:  # one rank moves nothing between GPUs: no bandwidth is claimed
        assert "one rank" in allreduce["message"] and "GB/s" not in allreduce["message"]
    else:
        assert f"busbw {report['allreduce']['busbw_gbps']} GB/s" in allreduce["message"]


def test_asking_for_more_gpus_than_visible_fails_the_visibility_check(cuda_count: int) -> None:
    argv = [sys.executable, "-m", "appliance.selfcheck", "--gpus",
            ",".join(map(str, range(cuda_count + 1))), "--algorithm", "DDTREE",
            "--block-size", str(BLOCK), "--budget", str(BUDGET), "--stream"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    report = gpucheck.parse_stream_line(done.stdout.splitlines()[-1])
    assert done.returncode == 1 and report is not None and not report["ok"]
    failed = {c["id"]: c["message"] for c in report["checks"] if not c["ok"]}
    assert set(failed) == {"nvml-inventory", "gpus-visible"}
    assert f"GPU {cuda_count} requested but NVML sees {cuda_count} GPU(s)" in failed["nvml-inventory"]
