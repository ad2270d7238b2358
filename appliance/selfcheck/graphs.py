"""CUDA-graph checks and the reproduction of DDTree's width mismatch.

A verify-shaped block is captured per role, width and batch size, then replayed
against eager. torch comes in as an argument (or through import_torch), never at import.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from .inventory import import_torch
from .report import GraphRole

GRAPH_HIDDEN = 1024  # small enough to be quick, large enough to run real GEMM kernels
GRAPH_HEADS = 8
GRAPH_PREFIX = 128  # cached prefix tokens each request attends to, like a KV cache
GRAPH_TOLERANCE = 2e-2  # bf16: replay should match eager to rounding, normally exactly


# --------------------------------------------------------------------------- pure parts


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


# --------------------------------------------------------------------------- torch checks


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
    torch, err = import_torch()
    if torch is None:
        raise RuntimeError(f"torch is needed to reproduce the width mismatch: {err}")
    try:
        _feed_wider_batch(torch, captured_width, fed_width, bs)
    except Exception:
        return traceback.format_exc()
    return ""


def reproduce_width_mismatch(captured_width: int = 8, fed_width: int = 33, bs: int = 1) -> str:
    """The exact error text torch raises when a block-width graph gets budget+1 rows."""
    torch, err = import_torch()
    if torch is None:
        raise RuntimeError(f"torch is needed to reproduce the width mismatch: {err}")
    try:
        _feed_wider_batch(torch, captured_width, fed_width, bs)
    except Exception as exc:
        return str(exc)
    return ""
