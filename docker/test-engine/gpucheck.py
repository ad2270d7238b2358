#!/usr/bin/env python3
"""The test engine's GPU self-check: NOT the appliance's gpucheck, a test stand-in.

Used only by the appliance's test suite, on machines without GPUs. The real engine
image runs the appliance.selfcheck package here (/opt/appliance/selfcheck.pyz) with `--stream`;
this stand-in takes the same arguments and prints the same `gpu-check: {json}` lines
for simulated H200s, so the worker, the parser and the panel see a self-check phase.
tests/appliance/selfcheck/test_selfcheck.py holds its lines against the real H200 output in
tests/fixtures/selfcheck. TEST_ENGINE_FAIL=selfcheck-driver reports a 575 driver,
selfcheck-nccl a failed all-reduce, selfcheck-crash dies without a report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

PREFIX = "gpu-check: "
FAIL = os.environ.get("TEST_ENGINE_FAIL", "").strip()
PACE_S = float(os.environ.get("TEST_ENGINE_PACE_S", "0.05"))


def emit(kind: str, payload: dict[str, Any]) -> None:
    print(PREFIX + json.dumps({"event": kind, **payload}, separators=(",", ":")), flush=True)
    time.sleep(PACE_S)


def roles(args: argparse.Namespace) -> list[dict[str, Any]]:
    algo = (args.algorithm or "NONE").upper()
    if args.skip_graphs:
        return []
    if algo == "NONE":
        return [{"role": "decode", "width": 1, "mask": "causal"}]
    block = args.block_size
    if algo == "DDTREE":
        budget = args.budget if args.budget is not None else block - 1
        verify = {"role": "target_verify", "width": budget + 1, "mask": "tree"}
    else:
        verify = {"role": "target_verify", "width": block, "mask": "causal"}
    return [verify, {"role": "draft", "width": block, "mask": "full"}]


def check(checks: list[dict[str, Any]], id_: str, ok: bool, message: str, fix: str = "") -> None:
    item = {"id": id_, "ok": ok, "message": message, "fix": fix}
    checks.append(item)
    emit("check", item)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpucheck (test engine stand-in)")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--gpus", default="0")
    p.add_argument("--algorithm", default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--budget", type=int, default=None)
    p.add_argument("--max-bs", type=int, default=4)
    p.add_argument("--skip-graphs", action="store_true")
    p.add_argument("--skip-allreduce", action="store_true")
    args, _ = p.parse_known_args(argv)
    started = time.monotonic()
    gpus = [int(g) for g in args.gpus.split(",") if g]
    graph_roles = roles(args)
    emit("begin", {"gpus": gpus, "roles": graph_roles, "max_bs": args.max_bs})
    if FAIL == "selfcheck-crash":
        print("Segmentation fault (core dumped)", file=sys.stderr, flush=True)
        return 139
    driver = "575.57.08" if FAIL == "selfcheck-driver" else "580.159.04"
    inventory = [{"index": g, "name": "NVIDIA H200 (test engine)", "memory_total_gb": 150.75,
                  "memory_free_gb": 150.11, "uuid": f"GPU-00000000-0000-0000-0000-00000000000{g}"}
                 for g in gpus]
    emit("gpus", {"driver_version": driver, "cuda_driver_version": "13.0", "gpus": inventory})
    checks: list[dict[str, Any]] = []
    if FAIL == "selfcheck-driver":
        check(checks, "driver-too-old", False,
              f"driver {driver} is older than 580, which CUDA 13 images need",
              "upgrade the host driver to 580 or newer, or use a CUDA 12.9 (-cu129) image")
    else:
        check(checks, "driver-version", True, f"driver {driver} supports CUDA 13")
    check(checks, "gpus-visible", True, f"{len(gpus)} GPU(s) visible to CUDA")
    allreduce: dict[str, Any] = {}
    if not args.skip_allreduce:
        n = len(gpus)
        busbw = round(2 * (n - 1) / n * 480.0, 2) if n > 1 else 0.0
        allreduce = {"world_size": n, "size_mb": 256.0, "ok": FAIL != "selfcheck-nccl",
                     "algbw_gbps": 480.0, "busbw_gbps": busbw}
        if FAIL == "selfcheck-nccl":
            allreduce["error"] = "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"
            check(checks, "allreduce", False, f"NCCL all-reduce failed: {allreduce['error']}",
                  "rerun with NCCL_DEBUG=INFO; run the engine container with --ipc host "
                  "(or a large --shm-size) and check the GPUs' links")
        elif n == 1:
            check(checks, "allreduce", True, "NCCL all-reduce on 1 GPU is correct (one rank: "
                  "no link between GPUs to measure)")
        else:
            check(checks, "allreduce", True, f"NCCL all-reduce over {n} GPU(s): busbw {busbw} "
                  "GB/s, algbw 480.0 GB/s")
    graphs = []
    for role in graph_roles:
        graphs.append({**role, "ok": True, "bs": [1, 2, 4], "max_abs_err_vs_eager": 0.0,
                       "replay_ms": 0.06, "eager_ms": 0.5})
        check(checks, f"cuda-graph-{role['role'].replace('_', '-')}", True,
              f"{role['role']} graph at width {role['width']} replays like eager (max err 0)")
    ok = all(c["ok"] for c in checks)
    emit("report", {"ok": ok, "elapsed_s": round(time.monotonic() - started, 2),
                    "driver_version": driver, "cuda_driver_version": "13.0",
                    "torch_version": "test-engine", "gpus": inventory,
                    "topology": {"gpus": gpus}, "allreduce": allreduce, "graphs": graphs,
                    "checks": checks})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
