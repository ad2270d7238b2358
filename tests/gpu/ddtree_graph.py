"""A DDTree verify step built with the pinned SGLang source's own pieces, replayed through a
CUDA graph captured at the target's verify width (budget+1 = 33 tokens per request).

The source's tree builder (ddtree_utils.build_ddtree_tree), verify-input compiler
(compile_ddtree_tree) and FA metadata kernel (kernels/ops/speculative/ddtree.py:
build_ddtree_fa_full_metadata_triton, the path fa3 reads: every query row gets the committed
prefix plus only the tree nodes it may see) feed a one-layer MLA-shaped target (a 576-wide
latent KV shared by the heads, 512 of it as values) whose attention is written in torch:
fa3's compiled kernel cannot travel to the test machine, its inputs can. The same step runs
eagerly, through the graph, and through a dense boolean mask (compile_ddtree_tree's packed
mask, the triton/flashinfer path) as a reference; the accepted path comes from the source's
follow_verified_tree_gpu (Triton) and its CPU twin follow_verified_tree.
"""

from __future__ import annotations

import importlib
import sys
import tarfile
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

BARE = ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.kernels", "sglang.kernels.ops",
        "sglang.kernels.ops.speculative")


def load_source(archive: Path, into: Path) -> tuple[Any, Any]:
    """ddtree_utils and the DDTree Triton kernels of the snapshot, imported without running
    SGLang's package __init__ (which imports the whole engine)."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    python = next(into.glob("sglang-*/python"))
    for name in BARE:
        module = types.ModuleType(name)
        module.__path__ = [str(python.joinpath(*name.split(".")))]
        sys.modules[name] = module
    return (importlib.import_module("sglang.srt.speculative.ddtree_utils"),
            importlib.import_module("sglang.kernels.ops.speculative.ddtree"))


@dataclass
class Shapes:
    bs: int = 2
    block: int = 8
    budget: int = 32
    vocab: int = 4096
    heads: int = 16
    latent: int = 576  # MLA: kv_lora_rank 512 + rope 64, one latent per token for all heads
    values: int = 512
    pool: int = 8192
    prefix: tuple[int, ...] = (37, 120)

    @property
    def width(self) -> int:
        return self.budget + 1


class TinyMLATarget:
    def __init__(self, shapes: Shapes, device: torch.device) -> None:
        gen = torch.Generator(device=device).manual_seed(7)
        s = shapes
        scale = s.latent ** -0.5

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device) * scale

        self.s, self.device = s, device
        self.embed = rand(s.vocab, s.latent) * 8
        self.q_proj = rand(s.latent, s.heads * s.latent)
        self.kv_proj = rand(s.latent, s.latent)
        self.o_proj = rand(s.heads * s.values, s.vocab)
        self.kv_pool = rand(s.pool, s.latent)
        self.req_to_token = torch.arange(s.pool, device=device, dtype=torch.int32).view(2, -1)[:s.bs]

    def hidden(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = torch.arange(self.s.latent, device=self.device) / self.s.latent
        ids, positions = ids.reshape(-1), positions.reshape(-1)
        return self.embed[ids] + torch.sin(positions.float()[:, None] * (1 + freqs))

    def write_tree_kv(self, h: torch.Tensor, seq_lens: torch.Tensor) -> None:
        s = self.s
        offsets = torch.arange(s.width, device=self.device)
        locs = (self.req_to_token.long().gather(1, seq_lens.view(-1, 1) + offsets)).view(-1)
        self.kv_pool[locs] = h @ self.kv_proj

    def attend(self, h: torch.Tensor, kv_rows: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Each query row attends over its own KV list (visible marks the used entries)."""
        s = self.s
        q = (h @ self.q_proj).view(-1, s.heads, s.latent)
        kv = self.kv_pool[kv_rows]  # [rows, keys, latent]
        scores = torch.einsum("rhd,rkd->rhk", q, kv) * s.latent ** -0.5
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        out = torch.einsum("rhk,rkv->rhv", scores.softmax(-1), kv[..., :s.values])
        return out.reshape(-1, s.heads * s.values) @ self.o_proj


def fa_metadata_forward(model: TinyMLATarget, kernels: Any, ids: torch.Tensor,
                        positions: torch.Tensor, visibility: torch.Tensor,
                        seq_lens: torch.Tensor, page_table: torch.Tensor,
                        cache_seqlens: torch.Tensor) -> torch.Tensor:
    """The fa3 path: per-row page table from the source's kernel, then attention."""
    s = model.s
    h = model.hidden(ids, positions)
    model.write_tree_kv(h, seq_lens)
    kernels.build_ddtree_fa_full_metadata_triton(
        visibility=visibility, req_to_token=model.req_to_token,
        req_pool_indices=torch.arange(s.bs, device=model.device), seq_lens=seq_lens,
        page_table=page_table, cache_seqlens=cache_seqlens, q_len=s.width)
    keys = torch.arange(page_table.shape[1], device=model.device)
    visible = keys[None, :] < cache_seqlens[:, None]
    return model.attend(h, page_table.clamp(min=0).long(), visible)


def dense_mask_forward(model: TinyMLATarget, ids: torch.Tensor, positions: torch.Tensor,
                       packed_mask: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
    """The triton/flashinfer path: the whole prefix+tree per request, the packed bool mask."""
    s = model.s
    h = model.hidden(ids, positions)
    model.write_tree_kv(h, torch.tensor(seq_lens, device=model.device))
    out, start = [], 0
    longest = max(seq_lens) + s.width
    for r, past in enumerate(seq_lens):
        n = s.width * (past + s.width)
        mask = packed_mask[start:start + n].view(s.width, past + s.width)
        start += n
        rows = model.req_to_token[r, :past + s.width].long()
        kv_rows = torch.zeros(s.width, longest, dtype=torch.long, device=model.device)
        visible = torch.zeros(s.width, longest, dtype=torch.bool, device=model.device)
        kv_rows[:, :past + s.width] = rows
        visible[:, :past + s.width] = mask
        out.append(model.attend(h[r * s.width:(r + 1) * s.width], kv_rows, visible))
    return torch.cat(out)


def draft_tree(utils: Any, s: Shapes, device: torch.device, seed: int) -> dict[str, Any]:
    """A draft tree from top-k draft scores (as the DFlash drafter's block gives them)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    depth, topk = s.block - 1, s.budget
    scores = torch.randn(s.bs, depth, topk, generator=gen, device=device) * 4
    log_probs = torch.sort(scores, dim=-1, descending=True).values.log_softmax(-1)
    token_ids = torch.randint(0, s.vocab, (s.bs, depth, topk), generator=gen, device=device)
    ids, depths, parents, child_maps, visibility, sizes, sizes_list = utils.build_ddtree_tree(
        None, s.budget, device, draft_top_log_probs=log_probs, draft_top_token_ids=token_ids)
    past = list(s.prefix[:s.bs])
    roots = torch.randint(0, s.vocab, (s.bs,), generator=gen, device=device)
    past_t = torch.tensor(past, device=device)
    verify_ids, positions, packed_mask, _ = utils.compile_ddtree_tree(
        root_token_ids=roots, node_token_ids=ids, node_depths=depths, visibility=visibility,
        start_positions=past_t, past_lengths=past_t, tree_budget=s.budget,
        actual_tree_sizes=sizes, device=device, past_lens_cpu=past, actual_sizes_cpu=sizes_list,
        verify_token_num=s.width, build_attention_mask=True)
    return {"ids": verify_ids, "positions": positions, "mask": packed_mask,
            "visibility": visibility.contiguous(), "parents": parents, "child_maps": child_maps,
            "sizes": sizes, "past": past}


def run(archive: Path, workdir: Path, bs: int = 2, trials: int = 4) -> dict[str, Any]:
    utils, kernels = load_source(archive, workdir)
    device = torch.device("cuda")
    s = Shapes(bs=bs, prefix=(37, 120)[:bs])
    model = TinyMLATarget(s, device)
    rows = bs * s.width
    static = {"ids": torch.zeros(rows, dtype=torch.long, device=device),
              "positions": torch.zeros(rows, dtype=torch.long, device=device),
              "visibility": torch.zeros(bs, s.width, s.width, dtype=torch.bool, device=device),
              "seq_lens": torch.zeros(bs, dtype=torch.long, device=device),
              "page_table": torch.full((rows, max(s.prefix) + s.width), -1, dtype=torch.int32,
                                       device=device),
              "cache_seqlens": torch.zeros(rows, dtype=torch.int32, device=device)}

    def step() -> torch.Tensor:
        return fa_metadata_forward(model, kernels, static["ids"], static["positions"],
                                   static["visibility"], static["seq_lens"],
                                   static["page_table"], static["cache_seqlens"])

    def load(tree: dict[str, Any]) -> None:
        for key in ("ids", "positions", "visibility"):
            static[key].copy_(tree[key].view_as(static[key]))
        static["seq_lens"].copy_(torch.tensor(tree["past"], device=device))

    load(draft_tree(utils, s, device, seed=0))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_logits = step()
    return _trials(utils, s, model, device, static, load, step, graph, graph_logits, trials)


def _timed(fn: Any, repeat: int = 50) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeat * 1e3


def _trials(utils: Any, s: Shapes, model: TinyMLATarget, device: torch.device,
            static: dict[str, torch.Tensor], load: Any, step: Any, graph: Any,
            graph_logits: torch.Tensor, trials: int) -> dict[str, Any]:
    worst_graph, worst_mask, same_accept, accept_lens = 0.0, 0.0, True, []
    for seed in range(1, trials + 1):
        tree = draft_tree(utils, s, device, seed)
        load(tree)
        eager = step().clone()
        graph.replay()
        replayed = graph_logits.clone()
        dense = dense_mask_forward(model, tree["ids"], tree["positions"], tree["mask"],
                                   tree["past"])
        worst_graph = max(worst_graph, float((replayed - eager).abs().max()))
        worst_mask = max(worst_mask, float((dense - eager).abs().max()))
        predict = replayed.argmax(-1).view(s.bs, s.width)
        draft = tree["ids"].view(s.bs, s.width)
        # Make the target agree with part of the tree so acceptance follows real edges.
        predict = _agree_along_first_chain(predict, draft, tree["parents"])
        _, _, lens, bonus = utils.follow_verified_tree_gpu(
            draft_tokens=draft, target_predict=predict, parents=tree["parents"],
            actual_tree_sizes=tree["sizes"])
        cpu_paths, cpu_bonus, _ = utils.follow_verified_tree(tree["child_maps"], predict.cpu())
        same_accept &= ([int(x) for x in lens.tolist()] == [len(p) for p in cpu_paths]
                        and bonus.tolist() == cpu_bonus.tolist())
        accept_lens.append([int(x) for x in lens.tolist()])
    return {"bs": s.bs, "width": s.width, "rows": s.bs * s.width, "trials": trials,
            "max_abs_graph_vs_eager": worst_graph, "max_abs_fa_metadata_vs_dense_mask": worst_mask,
            "gpu_follow_equals_cpu_follow": same_accept, "accept_lens": accept_lens,
            "replay_ms": _timed(graph.replay), "eager_ms": _timed(step)}


def _agree_along_first_chain(predict: torch.Tensor, draft: torch.Tensor,
                             parents: torch.Tensor) -> torch.Tensor:
    """Target predictions that accept node 1's chain for three steps: at each accepted node,
    the target predicts the token of its first child."""
    predict = predict.clone()
    for r in range(draft.shape[0]):
        node = 0
        for _ in range(3):
            children = (parents[r] == node).nonzero().flatten()
            if children.numel() == 0:
                break
            child = int(children[0])
            predict[r, node] = draft[r, child]
            node = child
    return predict
