"""GPU self-check run inside the engine container before the model loads.

The command line and the order of the checks: Options, run_check, build_parser, main.
(build_parser takes its --help description from this docstring's first line.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .graphs import run_graph_role, width_mismatch_traceback
from .inventory import check_driver, import_nvml, import_torch, nvml_inventory, parse_gpu_list
from .links import DEFAULT_ALLREDUCE_MB, peer_access, run_allreduce
from .report import (
    ALGORITHMS,
    STREAM_PREFIX,
    Check,
    GraphRole,
    Report,
    capture_batch_sizes,
    explicit_roles,
    graph_roles,
    stream_line,
    summarize,
)

# --------------------------------------------------------------------------- orchestration


@dataclass
class Options:
    gpus: list[int]
    roles: list[GraphRole]
    max_bs: int = 4
    allreduce_mb: float = DEFAULT_ALLREDUCE_MB
    skip_allreduce: bool = False
    skip_graphs: bool = False


def _nvml_part(opts: Options, report: Report) -> None:
    nvml, err = import_nvml()
    if nvml is None:
        report.add(Check("nvml-available", False, f"pynvml is not importable: {err}",
                                   "install nvidia-ml-py in the engine image"))
        return
    try:
        nvml_inventory(nvml, opts.gpus, report)
    except Exception as exc:
        report.add(Check("nvml-inventory", False, f"NVML could not read the GPUs: {exc}",
                                   "run the container with --gpus (NVIDIA container toolkit) "
                                   "and check nvidia-smi on the host"))
        return
    finally:
        with contextlib.suppress(Exception):  # nothing to release when init failed
            nvml.nvmlShutdown()
    report.tell("gpus", {"driver_version": report.driver_version,
                         "cuda_driver_version": report.cuda_driver_version, "gpus": report.gpus})
    report.add(check_driver(report.driver_version))


def _visibility_check(torch: Any, opts: Options) -> Check:
    count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    missing = [g for g in opts.gpus if g >= count]
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""
    if missing:
        return Check("gpus-visible", False,
                     f"GPU(s) {missing} requested but CUDA sees {count} device(s){where}",
                     "give the container the deployment's GPUs (device_requests / --gpus) "
                     "and number them from 0 inside it")
    return Check("gpus-visible", True, f"{len(opts.gpus)} GPU(s) visible to CUDA{where}")


def _peer_check(torch: Any, opts: Options, report: Report) -> Check | None:
    if len(opts.gpus) < 2:
        return None
    pairs = peer_access(torch, opts.gpus)
    report.topology["peer_access"] = pairs
    bad = [f"{p['from']}->{p['to']}" for p in pairs if not p["ok"]]
    if bad:
        return Check("peer-access", False, f"no peer access between {', '.join(bad)}",
                     "NCCL will fall back to slow paths: enable NVLink/P2P (check nvidia-smi "
                     "topo -m, disable PCIe ACS, use IOMMU passthrough) or use GPUs on one switch")
    return Check("peer-access", True, f"peer access between all {len(pairs)} GPU pairs")


def _allreduce_check(torch: Any, opts: Options, report: Report) -> Check:
    report.allreduce = run_allreduce(torch, opts.gpus, opts.allreduce_mb)
    ar = report.allreduce
    if ar["ok"] and ar["world_size"] == 1:
        return Check("allreduce", True, "NCCL all-reduce on 1 GPU is correct (one rank: no "
                     "link between GPUs to measure)")
    if ar["ok"]:
        return Check("allreduce", True, f"NCCL all-reduce over {ar['world_size']} GPU(s): "
                     f"busbw {ar['busbw_gbps']} GB/s, algbw {ar['algbw_gbps']} GB/s")
    return Check("allreduce", False,
                 f"NCCL all-reduce failed: {ar.get('error', 'wrong sum')}",
                 "rerun with NCCL_DEBUG=INFO; run the engine container with --ipc host "
                 "(or a large --shm-size) and check the GPUs' links")


def _graph_checks(torch: Any, opts: Options, report: Report) -> None:
    device = torch.device("cuda", opts.gpus[0])
    torch.cuda.set_device(device)
    sizes = capture_batch_sizes(opts.max_bs)
    for role in opts.roles:
        try:
            result = run_graph_role(torch, role, sizes, device)
        except Exception as exc:
            result = {"role": role.role, "width": role.width, "bs": sizes, "ok": False,
                      "error": f"{type(exc).__name__}: {exc}"}
        report.graphs.append(result)
        name = f"cuda-graph-{role.role.replace('_', '-')}"
        if result["ok"]:
            report.add(Check(name, True, f"{role.role} graph at width {role.width} replays "
                             f"like eager (max err {result['max_abs_err_vs_eager']:.3g})"))
        else:
            detail = result.get("error") or f"max err {result.get('max_abs_err_vs_eager')}"
            report.add(Check(name, False,
                             f"{role.role} graph at width {role.width} differs from eager: "
                             f"{detail}",
                             "run the engine with --disable-cuda-graph to confirm, and check "
                             "the CUDA/driver pairing"))


def run_check(
    opts: Options, listener: Callable[[str, dict[str, Any]], None] | None = None
) -> Report:
    report = Report(listener=listener)
    started = time.monotonic()
    report.tell("begin", {"gpus": list(opts.gpus), "roles": [asdict(r) for r in opts.roles],
                          "max_bs": opts.max_bs})
    _nvml_part(opts, report)
    torch, err = import_torch()
    if torch is None:
        report.add(Check("torch-available", False, f"torch is not importable: {err}",
                         "run gpu-check inside the engine image, which has torch "
                         "built for CUDA 13"))
    else:
        report.torch_version = str(torch.__version__)
        visible = _visibility_check(torch, opts)
        report.add(visible)
        if visible.ok:
            _torch_part(torch, opts, report)
    report.elapsed_s = round(time.monotonic() - started, 2)
    report.ok = summarize(report.checks)
    return report


def _torch_part(torch: Any, opts: Options, report: Report) -> None:
    peer = _peer_check(torch, opts, report)
    if peer is not None:
        report.add(peer)
    if not opts.skip_allreduce:
        report.add(_allreduce_check(torch, opts, report))
    if not opts.skip_graphs:
        _graph_checks(torch, opts, report)


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    summary = (__doc__ or "").splitlines()[0]
    p = argparse.ArgumentParser(prog="appliance gpu-check", description=summary)
    p.add_argument("--gpus", type=parse_gpu_list, default=None,
                   help="CUDA indices to check, e.g. 0,1,2,3 (default: all visible)")
    p.add_argument("--algorithm", default=None, type=str.upper, choices=ALGORITHMS)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--budget", type=int, default=None)
    p.add_argument("--verify-width", type=int, default=None)
    p.add_argument("--draft-width", type=int, default=None)
    p.add_argument("--max-bs", type=int, default=4)
    p.add_argument("--allreduce-mb", type=float, default=DEFAULT_ALLREDUCE_MB)
    p.add_argument("--skip-allreduce", action="store_true")
    p.add_argument("--skip-graphs", action="store_true")
    p.add_argument("--reproduce-width-mismatch", action="store_true",
                   help="capture at the block width, feed budget+1 rows; print the error")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--stream", action="store_true",
                   help=f"print each result as it happens, one '{STREAM_PREFIX}{{json}}' line")
    return p


def roles_from_args(args: argparse.Namespace) -> list[GraphRole]:
    if args.algorithm:
        return graph_roles(args.algorithm, args.block_size, args.budget,
                           args.verify_width, args.draft_width)
    if args.verify_width:
        return explicit_roles(args.verify_width, args.draft_width)
    return graph_roles("NONE")


def _default_gpus() -> list[int]:
    torch, _ = import_torch()
    if torch is not None and torch.cuda.is_available():
        return list(range(int(torch.cuda.device_count())))
    return [0]


def _print_human(report: Report) -> None:
    print(f"gpu-check: {'OK' if report.ok else 'FAILED'} in {report.elapsed_s} s "
          f"(driver {report.driver_version}, CUDA {report.cuda_driver_version})")
    for gpu in report.gpus:
        print(f"  GPU {gpu['index']}: {gpu['name']}, {gpu['memory_free_gb']}/"
              f"{gpu['memory_total_gb']} GB free")
    for check in report.checks:
        print(f"  [{'ok' if check.ok else 'FAIL'}] {check.id}: {check.message}")
        if not check.ok and check.fix:
            print(f"         fix: {check.fix}")


def _emit(kind: str, payload: dict[str, Any]) -> None:
    print(stream_line(kind, payload), flush=True)


def _mismatch_main(args: argparse.Namespace) -> int:
    captured = args.draft_width or args.block_size or 8
    fed = args.verify_width or ((args.budget + 1) if args.budget else 33)
    text = width_mismatch_traceback(captured, fed)
    error = text.strip().splitlines()[-1] if text.strip() else ""
    print(json.dumps({"captured_width": captured, "fed_width": fed, "error": error,
                      "traceback": text}, indent=2))
    return 0 if error else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.reproduce_width_mismatch:
        return _mismatch_main(args)
    try:
        roles = roles_from_args(args)
        if args.max_bs < 1:
            raise ValueError("--max-bs must be at least 1")
    except ValueError as exc:
        bad = Check("arguments", False, str(exc), "see appliance gpu-check --help")
        if args.stream:
            _emit("check", asdict(bad))
            _emit("report", {"ok": False, "elapsed_s": 0.0, "checks": [asdict(bad)]})
        else:
            print(json.dumps({"ok": False, "checks": [asdict(bad)]}))
        return 2
    opts = Options(gpus=args.gpus or _default_gpus(), roles=roles, max_bs=args.max_bs,
                   allreduce_mb=args.allreduce_mb, skip_allreduce=args.skip_allreduce,
                   skip_graphs=args.skip_graphs)
    report = run_check(opts, listener=_emit if args.stream else None)
    if args.stream:
        _emit("report", report.to_dict())
    elif args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_human(report)
    return 0 if report.ok else 1
