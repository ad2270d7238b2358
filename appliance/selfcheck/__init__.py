"""GPU self-check run inside the engine container before the model loads.

A DDTree deployment that is mis-sized (wrong driver, dead peer links, a CUDA graph
captured at the wrong width) otherwise fails only after the ~6 minute load of a
590 GB model. This module finds those faults in seconds and prints JSON.

torch and pynvml are imported lazily: the appliance (web, worker, CI) imports
this module on machines without either, and a missing one must become a failed
check with a fix, never a traceback.

Usage:
    python -m appliance.selfcheck --gpus 0,1 --algorithm DDTREE --block-size 8 --budget 32 --json

With --stream (what the engine entrypoint uses) every check is printed the moment it
finishes, one line each, `gpu-check: {json}`: a `begin` line, one `check` line per check,
then one `report` line with the whole report. The worker's log parser reads these lines,
so the panel shows the self-check as it runs; STREAM_PREFIX is the contract between them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_DRIVER_MAJOR = 580  # CUDA 13 user-space needs an R580 (or newer) kernel driver
DEFAULT_ALLREDUCE_MB = 256.0
ALLREDUCE_TIMEOUT_S = 120.0
GRAPH_HIDDEN = 1024  # small enough to be quick, large enough to run real GEMM kernels
GRAPH_HEADS = 8
GRAPH_PREFIX = 128  # cached prefix tokens each request attends to, like a KV cache
GRAPH_TOLERANCE = 2e-2  # bf16: replay should match eager to rounding, normally exactly
ALGORITHMS = ("NONE", "EAGLE3", "DFLASH", "DDTREE")
STREAM_PREFIX = "gpu-check: "

# NVML topology levels -> the names `nvidia-smi topo -m` prints.
TOPOLOGY_NAMES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper


@dataclass
class Check:
    id: str
    ok: bool
    message: str
    fix: str = ""


@dataclass(frozen=True)
class GraphRole:
    role: str  # "target_verify", "draft" or "decode", as SGLang names its runners
    width: int  # tokens per request in the captured static buffer
    mask: str  # "tree", "causal" or "full": the attention mask the role uses


@dataclass
class Report:
    ok: bool = False
    elapsed_s: float = 0.0
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    torch_version: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)
    allreduce: dict[str, Any] = field(default_factory=dict)
    graphs: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    # Told (kind, payload) as the check goes: the --stream output. Not part of the report.
    listener: Callable[[str, dict[str, Any]], None] | None = field(
        default=None, repr=False, compare=False
    )

    def add(self, *checks: Check) -> None:
        for check in checks:
            self.checks.append(check)
            self.tell("check", asdict(check))

    def tell(self, kind: str, payload: dict[str, Any]) -> None:
        if self.listener is not None:
            self.listener(kind, payload)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("listener", None)
        return data


# --------------------------------------------------------------------------- pure parts


def graph_roles(
    algorithm: str = "NONE",
    block_size: int | None = None,
    budget: int | None = None,
    verify_width: int | None = None,
    draft_width: int | None = None,
) -> list[GraphRole]:
    """The CUDA-graph widths a deployment captures, as the DDTree fix defines them.

    DDTREE verifies budget+1 tokens per request with a tree mask while its DFlash
    drafter still runs at block size; DFLASH verifies its block with a causal
    mask; NONE decodes one token. Explicit widths override the derived ones.
    """
    algo = algorithm.upper()
    if algo not in ALGORITHMS:
        choices = ", ".join(ALGORITHMS)
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {choices}")
    if algo == "NONE":
        return [GraphRole("decode", verify_width or 1, "causal")]
    if block_size is None and (verify_width is None or draft_width is None):
        raise ValueError(f"{algo} needs --block-size (or both --verify-width and --draft-width)")
    block = block_size if block_size is not None else int(draft_width or 0)
    if block < 1:
        raise ValueError("block size must be at least 1")
    if algo == "DDTREE":
        # PR #27509 defaults the budget to block-1 when unset.
        tree_budget = budget if budget is not None else block - 1
        if tree_budget < 1:
            raise ValueError("DDTREE budget must be at least 1")
        verify, mask = tree_budget + 1, "tree"
    else:
        verify, mask = block, "causal"
    return [
        GraphRole("target_verify", verify_width or verify, mask),
        # The DFlash drafter fills the whole block in one forward: it sees every slot.
        GraphRole("draft", draft_width or block, "full"),
    ]


def explicit_roles(verify_width: int, draft_width: int | None) -> list[GraphRole]:
    """Roles from widths alone (no algorithm): a tree verify plus an optional draft."""
    roles = [GraphRole("target_verify", verify_width, "tree" if verify_width > 1 else "causal")]
    if draft_width:
        roles.append(GraphRole("draft", draft_width, "full"))
    return roles


def capture_batch_sizes(max_bs: int) -> list[int]:
    """Powers of two up to max_bs, plus max_bs itself, like SGLang's capture list."""
    if max_bs < 1:
        raise ValueError("max batch size must be at least 1")
    sizes = [1 << i for i in range(max_bs.bit_length()) if (1 << i) <= max_bs]
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def bus_bandwidth(algbw_gbps: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n (0 on one rank)."""
    if world_size < 1:
        raise ValueError("world size must be at least 1")
    return algbw_gbps * 2.0 * (world_size - 1) / world_size


def parse_driver_version(text: str) -> tuple[int, ...]:
    """'580.159.04' -> (580, 159, 4); raises ValueError on anything else."""
    parts = text.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a driver version: {text!r}")
    return tuple(int(p) for p in parts)


def check_driver(version: str | None, minimum: int = MIN_DRIVER_MAJOR) -> Check:
    if version is None:
        return Check("driver-version", False, "the NVIDIA driver version could not be read",
                     "install the NVIDIA driver (580 or newer) and the container toolkit")
    try:
        major = parse_driver_version(version)[0]
    except ValueError as exc:
        return Check("driver-version", False, str(exc), "check the NVIDIA driver installation")
    if major < minimum:
        return Check(
            "driver-too-old", False,
            f"driver {version} is older than {minimum}, which CUDA 13 images need",
            f"upgrade the host driver to {minimum} or newer, or use a CUDA 12.9 (-cu129) image",
        )
    return Check("driver-version", True, f"driver {version} supports CUDA 13")


def format_cuda_version(value: int) -> str:
    """NVML's 13000 -> '13.0'."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def visible_device_ids(env: Mapping[str, str] | None = None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list (indices or UUIDs), or None when unset.

    NVML ignores that variable while CUDA honours it, so CUDA index i is NVML
    device ids[i]; the check must translate or it inspects the wrong GPUs.
    """
    source = os.environ if env is None else env
    raw = source.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def parse_gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--gpus takes comma-separated indices: {text!r}") from exc
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"--gpus needs distinct non-negative indices: {text!r}")
    return gpus


def tree_parents(width: int, seed: int = 0) -> list[int]:
    """A deterministic random tree over width nodes (node 0 is the root, parent -1)."""
    state = seed * 2654435761 + 12345
    parents = [-1]
    for node in range(1, width):
        state = (state * 1103515245 + 12345) % (1 << 31)
        parents.append(state % node)
    return parents


def mask_rows(kind: str, width: int, seed: int = 0) -> list[list[bool]]:
    """Which of the width in-flight tokens each token may attend to."""
    if kind == "full":
        return [[True] * width for _ in range(width)]
    if kind == "causal":
        return [[j <= i for j in range(width)] for i in range(width)]
    if kind != "tree":
        raise ValueError(f"unknown mask kind {kind!r}")
    parents = tree_parents(width, seed)
    rows = []
    for i in range(width):
        row = [False] * width
        node = i
        while node >= 0:  # a node sees itself and its ancestors, as DDTree's tree mask does
            row[node] = True
            node = parents[node]
        rows.append(row)
    return rows


def summarize(checks: Sequence[Check]) -> bool:
    return all(c.ok for c in checks)


# --------------------------------------------------------------------------- lazy imports


def _import_torch() -> tuple[Any | None, str | None]:
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken CUDA install raising OSError
        return None, f"{type(exc).__name__}: {exc}"
    return torch, None


def _import_nvml() -> tuple[Any | None, str | None]:
    try:
        import pynvml
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return pynvml, None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- NVML


def nvml_inventory(nvml: Any, requested: Sequence[int], report: Report) -> list[Any]:
    """Fill driver, per-GPU facts and topology from NVML; returns the handles."""
    nvml.nvmlInit()
    report.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
    try:
        report.cuda_driver_version = format_cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
    except nvml.NVMLError:
        report.cuda_driver_version = None
    visible = visible_device_ids()
    count = int(nvml.nvmlDeviceGetCount())
    handles = []
    for index in requested:
        if visible is not None and index >= len(visible):
            raise LookupError(f"GPU {index} is not in CUDA_VISIBLE_DEVICES={','.join(visible)}")
        ident = str(index) if visible is None else visible[index]
        if ident.isdigit() and int(ident) >= count:
            raise LookupError(f"GPU {ident} requested but NVML sees {count} GPU(s)")
        if ident.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(ident))
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(ident)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        report.gpus.append({
            "index": index,
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "memory_total_gb": round(mem.total / 1e9, 2),
            "memory_free_gb": round(mem.free / 1e9, 2),
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        })
        handles.append(handle)
    report.topology.update(nvml_topology(nvml, requested, handles))
    return handles


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
    import torch
    import torch.distributed as dist

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
    import torch.multiprocessing as mp

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


class VerifyBlock:
    """A verify-shaped attention block: QKV projection, masked softmax over a cached
    prefix plus the in-flight tokens, output projection. bf16, like the engine.

    Inputs are [bs*width, hidden] token rows plus a [bs, width, width] mask, the
    same flattened layout SGLang's cuda_graph_runner keeps in its static buffers.
    """

    def __init__(self, torch: Any, device: Any, hidden: int = GRAPH_HIDDEN,
                 heads: int = GRAPH_HEADS, prefix: int = GRAPH_PREFIX, seed: int = 0) -> None:
        self.torch = torch
        self.hidden, self.heads, self.prefix = hidden, heads, prefix
        self.head_dim = hidden // heads
        gen = torch.Generator(device="cpu").manual_seed(seed)
        scale = 1.0 / math.sqrt(hidden)

        def weight(*shape: int) -> Any:
            return (torch.randn(*shape, generator=gen) * scale).to(device, torch.bfloat16)

        self.w_qkv = weight(hidden, 3 * hidden)
        self.w_o = weight(hidden, hidden)
        self.k_cache = weight(prefix, hidden) * math.sqrt(hidden)
        self.v_cache = weight(prefix, hidden) * math.sqrt(hidden)

    def __call__(self, x: Any, mask: Any) -> Any:
        torch = self.torch
        bs, width = mask.shape[0], mask.shape[1]
        h, d = self.heads, self.head_dim
        q, k, v = (x @ self.w_qkv).split(self.hidden, dim=-1)

        def heads_first(t: Any) -> Any:  # [bs*width, hidden] -> [bs, h, width, d]
            return t.view(bs, width, h, d).transpose(1, 2)

        kp = self.k_cache.view(1, self.prefix, h, d).transpose(1, 2).expand(bs, h, self.prefix, d)
        vp = self.v_cache.view(1, self.prefix, h, d).transpose(1, 2).expand(bs, h, self.prefix, d)
        keys = torch.cat([kp, heads_first(k)], dim=2)
        values = torch.cat([vp, heads_first(v)], dim=2)
        scores = (heads_first(q) @ keys.transpose(-1, -2)).float() / math.sqrt(d)
        visible = torch.cat([mask.new_ones(bs, width, self.prefix), mask], dim=-1)
        scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(torch.bfloat16)
        out = (probs @ values).transpose(1, 2).reshape(bs * width, self.hidden)
        return out @ self.w_o


def make_mask(torch: Any, kind: str, bs: int, width: int, device: Any) -> Any:
    rows = [mask_rows(kind, width, seed=b) for b in range(bs)]
    return torch.tensor(rows, dtype=torch.bool, device=device)


class CapturedGraph:
    """Static buffers + one captured graph, replayed the way cuda_graph_runner does.

    With capture=False (no CUDA) only the static buffers exist, so replay's
    copy into them still behaves, and fails, as on a GPU.
    """

    def __init__(self, torch: Any, block: VerifyBlock, bs: int, width: int, mask_kind: str,
                 device: Any, pool: Any = None, capture: bool = True) -> None:
        self.torch, self.bs, self.width = torch, bs, width
        self.static_x = torch.zeros(bs * width, block.hidden, dtype=torch.bfloat16, device=device)
        self.static_mask = make_mask(torch, mask_kind, bs, width, device)
        self.graph: Any = None
        if not capture:
            self.static_out = block(self.static_x, self.static_mask)
            return
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm up off the capture stream, as SGLang does
            for _ in range(2):
                block(self.static_x, self.static_mask)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.static_out = block(self.static_x, self.static_mask)

    def replay(self, x: Any, mask: Any) -> Any:
        # SGLang: self.input_ids[:raw_num_token].copy_(forward_batch.input_ids), then replay.
        raw_num_token = x.shape[0]
        self.static_x[:raw_num_token].copy_(x)
        self.static_mask.copy_(mask)
        if self.graph is not None:
            self.graph.replay()
        return self.static_out[:raw_num_token]


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _time_ms(torch: Any, fn: Callable[[], Any], iters: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end) / iters)


def run_graph_role(torch: Any, role: GraphRole, batch_sizes: Sequence[int], device: Any,
                   tolerance: float = GRAPH_TOLERANCE) -> dict[str, Any]:
    block = VerifyBlock(torch, device)
    pool = torch.cuda.graph_pool_handle()  # one pool for every bs, like SGLang's runner
    per_bs = []
    for bs in sorted(batch_sizes, reverse=True):  # largest first so smaller ones reuse the pool
        graph = CapturedGraph(torch, block, bs, role.width, role.mask, device, pool)
        x = torch.randn(bs * role.width, block.hidden, device=device).to(torch.bfloat16)
        mask = make_mask(torch, role.mask, bs, role.width, device)
        eager = block(x, mask)
        replayed = graph.replay(x, mask).clone()
        torch.cuda.synchronize()
        err = float((replayed.float() - eager.float()).abs().max().item())
        per_bs.append({
            "bs": bs, "max_abs_err_vs_eager": err,
            "replay_ms": round(_time_ms(torch, _bind(graph.replay, x, mask)), 4),
            "eager_ms": round(_time_ms(torch, _bind(block, x, mask)), 4),
        })
    per_bs.sort(key=lambda r: r["bs"])
    largest = per_bs[-1]
    max_err = max(r["max_abs_err_vs_eager"] for r in per_bs)
    return {
        "role": role.role, "width": role.width, "mask": role.mask,
        "bs": [r["bs"] for r in per_bs], "max_abs_err_vs_eager": max_err,
        "replay_ms": largest["replay_ms"], "eager_ms": largest["eager_ms"],
        "ok": bool(max_err <= tolerance and math.isfinite(max_err)), "per_bs": per_bs,
    }


# --------------------------------------------------------------------------- width mismatch


def _feed_wider_batch(torch: Any, captured_width: int, fed_width: int, bs: int) -> None:
    """Capture at captured_width, then replay with fed_width rows per request.

    This is DDTree's verify bug: the graph was captured with num_tokens_per_bs =
    block size, and replay copies bs*(budget+1) rows into the bs*block buffer.
    """
    on_gpu = bool(torch.cuda.is_available())
    device = torch.device("cuda") if on_gpu else torch.device("cpu")
    block = VerifyBlock(torch, device, hidden=256, heads=2, prefix=16)
    graph = CapturedGraph(torch, block, bs, captured_width, "causal", device, capture=on_gpu)
    new_input = torch.randn(bs * fed_width, block.hidden, device=device).to(torch.bfloat16)
    graph.replay(new_input, graph.static_mask)  # raises: [bs*captured] vs [bs*fed] rows


def width_mismatch_traceback(captured_width: int = 8, fed_width: int = 33, bs: int = 1) -> str:
    """The full traceback text of the mismatch ('' if nothing was raised)."""
    torch, err = _import_torch()
    if torch is None:
        raise RuntimeError(f"torch is needed to reproduce the width mismatch: {err}")
    try:
        _feed_wider_batch(torch, captured_width, fed_width, bs)
    except Exception:
        return traceback.format_exc()
    return ""


def reproduce_width_mismatch(captured_width: int = 8, fed_width: int = 33, bs: int = 1) -> str:
    """The exact error text torch raises when a block-width graph gets budget+1 rows."""
    torch, err = _import_torch()
    if torch is None:
        raise RuntimeError(f"torch is needed to reproduce the width mismatch: {err}")
    try:
        _feed_wider_batch(torch, captured_width, fed_width, bs)
    except Exception as exc:
        return str(exc)
    return ""


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
    nvml, err = _import_nvml()
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
    torch, err = _import_torch()
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
    torch, _ = _import_torch()
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


def stream_line(kind: str, payload: Mapping[str, Any]) -> str:
    """One --stream line; appliance.logs.parser reads it back (parse_stream_line)."""
    return STREAM_PREFIX + json.dumps({"event": kind, **payload}, separators=(",", ":"))


def _emit(kind: str, payload: dict[str, Any]) -> None:
    print(stream_line(kind, payload), flush=True)


def parse_stream_line(text: str) -> dict[str, Any] | None:
    """The event of a --stream line, or None when the line is not one."""
    if not text.startswith(STREAM_PREFIX + "{"):
        return None
    try:
        data = json.loads(text[len(STREAM_PREFIX):])
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("event"), str) else None


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


if __name__ == "__main__":
    sys.exit(main())
