"""The links between the GPUs: NVML topology, NVLink counts, peer access, NCCL all-reduce."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_ALLREDUCE_MB = 256.0
ALLREDUCE_TIMEOUT_S = 120.0

# NVML topology levels -> the names `nvidia-smi topo -m` prints.
TOPOLOGY_NAMES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper


# --------------------------------------------------------------------------- pure parts


def bus_bandwidth(algbw_gbps: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n (0 on one rank)."""
    if world_size < 1:
        raise ValueError("world size must be at least 1")
    return algbw_gbps * 2.0 * (world_size - 1) / world_size


# --------------------------------------------------------------------------- NVML


def _active_nvlinks(nvml: Any, handle: Any) -> int:
    count = 0
    for link in range(NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                count += 1
        except nvml.NVMLError:
            break  # past the last link, or NVLink not supported on this GPU
    return count


def _link_type(nvml: Any, a: Any, b: Any, links_a: int) -> str:
    """'NV<k>' when the pair talks over NVLink (directly or via NVSwitch), else the PCIe level."""
    try:
        p2p = nvml.nvmlDeviceGetP2PStatus(a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        if p2p == nvml.NVML_P2P_STATUS_OK and links_a:
            return f"NV{links_a}"
    except (nvml.NVMLError, AttributeError):
        pass
    try:
        level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except nvml.NVMLError as exc:
        return f"unknown ({exc})"
    return TOPOLOGY_NAMES.get(level, f"level-{level}")


def nvml_topology(nvml: Any, requested: Sequence[int], handles: Sequence[Any]) -> dict[str, Any]:
    links = [_active_nvlinks(nvml, h) for h in handles]
    matrix = [
        ["X" if i == j else _link_type(nvml, handles[i], handles[j], links[i])
         for j in range(len(handles))]
        for i in range(len(handles))
    ]
    return {"gpus": list(requested), "matrix": matrix, "nvlink_active_links": links}


# --------------------------------------------------------------------------- torch checks


def peer_access(torch: Any, requested: Sequence[int]) -> list[dict[str, Any]]:
    return [
        {"from": a, "to": b, "ok": bool(torch.cuda.can_device_access_peer(a, b))}
        for a in requested for b in requested if a != b
    ]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _allreduce_worker(rank: int, gpus: list[int], port: int, size_mb: float, iters: int,
                      results: Any) -> None:
    """One rank of the all-reduce: fill with rank+1, sum, check, time.

    Runs in a spawned process (CUDA cannot be forked), one per GPU, as the
    engine's tensor-parallel workers do.
    """
    import torch  # noqa: PLC0415 - optional: torch, in the engine image only
    import torch.distributed as dist  # noqa: PLC0415 - as above

    world = len(gpus)
    torch.cuda.set_device(gpus[rank])
    device = torch.device("cuda", gpus[rank])
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=device)
    try:
        numel = int(size_mb * 1e6) // 4
        buf = torch.empty(numel, dtype=torch.float32, device=device)
        # Small integers sum exactly in fp32, so any wrong or partial sum shows.
        expected = world * (world + 1) / 2
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        correct = bool(torch.all(buf == expected).item())
        for _ in range(3):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(iters):
            dist.all_reduce(buf)
        end.record()
        torch.cuda.synchronize()
        stats = torch.tensor([start.elapsed_time(end) / iters, 0.0 if correct else 1.0],
                             device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # slowest rank, any rank wrong
        if rank == 0:
            results.put({"ms": float(stats[0].item()), "ok": stats[1].item() == 0.0,
                         "bytes": numel * 4})
    finally:
        dist.destroy_process_group()


def run_allreduce(torch: Any, gpus: list[int], size_mb: float = DEFAULT_ALLREDUCE_MB,
                  iters: int = 20, timeout_s: float = ALLREDUCE_TIMEOUT_S) -> dict[str, Any]:
    import torch.multiprocessing as mp  # noqa: PLC0415 - optional: torch, in the engine image only

    # Multicast (NVLS) can wedge shared hosts and is not what the engine's TP path needs here.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    world = len(gpus)
    out: dict[str, Any] = {"world_size": world, "size_mb": size_mb, "algbw_gbps": None,
                           "busbw_gbps": None, "ok": False}
    args = (gpus, _free_port(), size_mb, iters, results)
    procs = mp.start_processes(_allreduce_worker, args=args, nprocs=world, join=False,
                               start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not procs.join(timeout=1.0):
            if time.monotonic() > deadline:
                out["error"] = f"all-reduce did not finish within {timeout_s:.0f} s (NCCL hang?)"
                return out
    except Exception as exc:  # ProcessRaisedException carries the rank's traceback
        out["error"] = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        out["error_detail"] = str(exc)[-4000:]
        return out
    finally:
        for proc in procs.processes:
            if proc.is_alive():
                proc.terminate()
    if results.empty():
        out["error"] = "rank 0 returned no result"
        return out
    res = results.get()
    seconds = res["ms"] / 1e3
    algbw = res["bytes"] / seconds / 1e9
    out.update(algbw_gbps=round(algbw, 2), busbw_gbps=round(bus_bandwidth(algbw, world), 2),
               time_ms=round(res["ms"], 3), ok=bool(res["ok"]))
    if world == 1:
        out["note"] = "one rank: NCCL moves no data between GPUs, so bandwidth is not a link figure"
    return out
