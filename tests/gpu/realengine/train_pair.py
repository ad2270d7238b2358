"""Train a small target and its DFlash drafter on the GPU host, from fixed seeds, and write
both as model folders SGLang loads.

    python3 tests/gpu/realengine/train_pair.py OUTDIR [--seconds S] [--report FILE]

Writes into OUTDIR:
- trained-target/: Qwen3ForCausalLM (TARGET below: 32 layers, hidden 384), trained on the
  Python sources installed on the host (`corpus_files`: every `*.py` under the interpreter's
  stdlib and purelib folders, sorted, 1 file in 16 held out by a hash of its path) with a
  byte-level tokenizer made here (18 special tokens, then the 256 bytes: id = 18 + byte);
  `heldout.jsonl` beside its weights holds prompts cut from the held-out files only (the
  rig's bench prompts: never the training text).
- trained-dflash/: DFlashDraftModel (DRAFTER below: 3 layers, block 8, target layers
  [1, 10, 19, 29], mask token <|MASK|>), no embedding or head of its own (the target's are
  used), trained with the block loss on the target's own greedy continuations.
- trained-target-b/: a second target of the same shape from another seed and the training
  files read from the other end of the list, trained shorter: the drafter run against it is the wrong pair.
- train.json (and --report FILE): the files, tokens, parameters, steps, seconds, losses and
  the drafter's offline accept length on held-out prompts, with the distinct 4-gram ratio of
  the target's greedy rollouts beside it.

Why deep rather than wide: at these sizes a decoding step is bound by kernel launches and
latency, not by FLOPs, so its cost follows the number of layers, not their width (433c58ed7 on
one H100: a 24-layer hidden-512 target decodes at 1.78 ms a token, a 3-layer one at about
1.75 ms a token only because the speculative machinery's fixed cost dominates both). A real
target (Kimi K2.6: 61 layers) costs many times its drafter (a few layers); 32 thin layers
against a 3-layer drafter keep that ratio (about 10:1 in layers) while the whole target
trains in minutes.

The drafter's forward exists twice here: `Drafter.train_forward` packs many blocks of many
sequences into one attention call with a mask (what trains), `Drafter.serve_forward` does one
block the way 433c58ed7's DFlashWorkerV2 does it (context K/V from the captured target layers,
then the block attending to them and to itself both ways). They must agree:
tests/appliance/test_dflash_train_pair.py checks it on the CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
SPECIAL_COUNT = 18  # models.SPECIALS: [BOS] 0, [EOS] 1, [PAD] 2, ..., <|MASK|> 17
BOS, EOS, PAD, MASK = 0, 1, 2, 17
BYTE_OFFSET = SPECIAL_COUNT


@dataclass(frozen=True)
class TargetShape:
    layers: int = 32
    hidden: int = 384
    heads: int = 6
    kv_heads: int = 2
    head_dim: int = 64
    inner: int = 1536
    vocab: int = 384  # 18 specials + 256 bytes = 274 ids, padded
    rope_theta: float = 10000.0
    max_positions: int = 4096
    eps: float = 1e-6


@dataclass(frozen=True)
class DrafterShape:
    layers: int = 3
    block: int = 8
    target_layer_ids: tuple[int, ...] = (1, 10, 19, 29)  # at most L-2, ascending
    heads: int = 6
    kv_heads: int = 2
    head_dim: int = 64
    inner: int = 1536
    rope_theta: float = 10000.0
    gamma: float = 4.0  # loss weight of block position k: exp(-(k-1)/gamma)


@dataclass
class Budget:
    """Steps and sizes; `seconds` caps the whole run (each phase stops early if it must, and
    says so in the report)."""
    seconds: float = 500.0
    target_share: float = 0.55  # of `seconds`, target A's training
    b_share: float = 0.08  # of `seconds`, target B's (at most target_b_steps)
    drafter_min_s: float = 0.0  # the drafter's time when less is left of `seconds`
    seq: int = 512
    target_batch: int = 64
    target_steps: int = 6000
    target_lr: float = 2e-3
    target_b_steps: int = 150
    prompts: int = 3072
    prompt_len: int = 64
    rollout: int = 448
    drafter_batch: int = 32
    anchors: int = 48
    drafter_steps: int = 6000
    drafter_lr: float = 6e-4
    heldout_prompts: int = 64
    heldout_prompt_bytes: int = 256
    seed: int = 20261206
    extra: dict[str, Any] = field(default_factory=dict)


# -- the models -------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Qwen3RMSNorm: in float32, the weight applied in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (HF's rotate_half) of x [..., seq, dim] at positions
    [..., seq] (broadcast over heads where x has them)."""
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    if x.dim() == cos.dim() + 1:  # x has a heads axis before seq
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = nn.Parameter(torch.ones(head_dim))
        self.k_norm = nn.Parameter(torch.ones(head_dim))

    def split(self, x: torch.Tensor, heads: int) -> torch.Tensor:  # [B, T, h*d] -> [B, h, T, d]
        return x.view(*x.shape[:-1], heads, self.head_dim).transpose(-3, -2)

    def q(self, x: torch.Tensor, pos: torch.Tensor, theta: float, eps: float) -> torch.Tensor:
        return rope(rms_norm(self.split(self.q_proj(x), self.heads), self.q_norm, eps), pos, theta)

    def k(self, x: torch.Tensor, pos: torch.Tensor, theta: float, eps: float) -> torch.Tensor:
        return rope(rms_norm(self.split(self.k_proj(x), self.kv_heads), self.k_norm, eps), pos, theta)

    def v(self, x: torch.Tensor) -> torch.Tensor:
        return self.split(self.v_proj(x), self.kv_heads)

    def out(self, o: torch.Tensor) -> torch.Tensor:  # [B, h, T, d] -> [B, T, hidden]
        return self.o_proj(o.transpose(-3, -2).flatten(-2))


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, inner: int) -> None:
        super().__init__()
        self.input_layernorm = nn.Parameter(torch.ones(hidden))
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim)
        self.post_attention_layernorm = nn.Parameter(torch.ones(hidden))
        self.mlp = MLP(hidden, inner)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
         mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=q.shape[-3] != k.shape[-3])


class Target(nn.Module):
    """Qwen3ForCausalLM as HF and SGLang compute it (pre-norm, q/k head norms, neox rope,
    untied head); parameter names map one to one onto the checkpoint's."""

    def __init__(self, shape: TargetShape) -> None:
        super().__init__()
        self.shape = shape
        s = shape
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Layer(s.hidden, s.heads, s.kv_heads, s.head_dim, s.inner)
                                    for _ in range(s.layers))
        self.norm = nn.Parameter(torch.ones(s.hidden))
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)

    def forward(self, ids: torch.Tensor, capture: tuple[int, ...] = (),
                cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                start: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits [B, T, V] and the residual stream after each layer in `capture` (what
        SGLang's set_dflash_layers_to_capture takes: HF hidden_states[k + 1]). With a cache
        (one (k, v) [B, kv_heads, max_len, d] per layer), ids sit at positions start.."""
        s = self.shape
        length = ids.shape[1]
        pos = torch.arange(start, start + length, device=ids.device)
        h = self.embed_tokens(ids)
        captured = []
        for index, layer in enumerate(self.layers):
            x = rms_norm(h, layer.input_layernorm, s.eps)
            attn = layer.self_attn
            q = attn.q(x, pos, s.rope_theta, s.eps)
            k = attn.k(x, pos, s.rope_theta, s.eps)
            v = attn.v(x)
            if cache is not None:
                ck, cv = cache[index]
                ck[:, :, start:start + length] = k
                cv[:, :, start:start + length] = v
                k, v = ck[:, :, :start + length], cv[:, :, :start + length]
            h = h + attn.out(sdpa(q, k, v, causal=length > 1))
            h = h + layer.mlp(rms_norm(h, layer.post_attention_layernorm, s.eps))
            if index in capture:
                captured.append(h)
        return self.lm_head(rms_norm(h, self.norm, s.eps)), captured

    def checkpoint(self) -> dict[str, torch.Tensor]:
        out = {"model.embed_tokens.weight": self.embed_tokens.weight,
               "model.norm.weight": self.norm, "lm_head.weight": self.lm_head.weight}
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            out.update(_layer_tensors(layer, p))
        return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def _layer_tensors(layer: Layer, p: str) -> dict[str, torch.Tensor]:
    a = layer.self_attn
    return {p + "input_layernorm.weight": layer.input_layernorm,
            p + "post_attention_layernorm.weight": layer.post_attention_layernorm,
            p + "self_attn.q_proj.weight": a.q_proj.weight, p + "self_attn.k_proj.weight": a.k_proj.weight,
            p + "self_attn.v_proj.weight": a.v_proj.weight, p + "self_attn.o_proj.weight": a.o_proj.weight,
            p + "self_attn.q_norm.weight": a.q_norm, p + "self_attn.k_norm.weight": a.k_norm,
            p + "mlp.gate_proj.weight": layer.mlp.gate_proj.weight,
            p + "mlp.up_proj.weight": layer.mlp.up_proj.weight,
            p + "mlp.down_proj.weight": layer.mlp.down_proj.weight}


class Drafter(nn.Module):
    """DFlashDraftModel (433c58ed7 `sglang/srt/models/dflash.py`): fc and hidden_norm project
    the captured target layers to the context's K/V input (no input layer norm on it), Qwen3
    layers over the block, a final norm; embedding and head are the target's, frozen."""

    def __init__(self, shape: DrafterShape, target: Target) -> None:
        super().__init__()
        self.shape = shape
        hidden = target.shape.hidden
        self.eps = target.shape.eps
        self.fc = nn.Linear(len(shape.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(hidden))
        self.layers = nn.ModuleList(Layer(hidden, shape.heads, shape.kv_heads, shape.head_dim,
                                          shape.inner) for _ in range(shape.layers))
        self.norm = nn.Parameter(torch.ones(hidden))
        # The target's, never trained here (not registered as parameters).
        self.target_parts = (target.embed_tokens, target.lm_head)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """project_target_hidden: hidden_norm(fc(concat of the captured layers))."""
        return rms_norm(self.fc(features), self.hidden_norm, self.eps)

    def _layers(self, h: torch.Tensor, pos: torch.Tensor, ctx: torch.Tensor,
                ctx_pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        theta, eps = self.shape.rope_theta, self.eps
        for layer in self.layers:
            attn = layer.self_attn
            x = rms_norm(h, layer.input_layernorm, eps)
            q = attn.q(x, pos, theta, eps)
            k = torch.cat([attn.k(ctx, ctx_pos, theta, eps), attn.k(x, pos, theta, eps)], dim=-2)
            v = torch.cat([attn.v(ctx), attn.v(x)], dim=-2)
            h = h + attn.out(sdpa(q, k, v, mask=mask))
            h = h + layer.mlp(rms_norm(h, layer.post_attention_layernorm, eps))
        embed, head = self.target_parts
        return head(rms_norm(h, self.norm, eps))

    def block_input(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """Each block: the anchor token, then block-1 mask tokens ([..., A] -> [..., A*block])."""
        block = self.shape.block
        tokens = torch.full((*anchor_tokens.shape, block), MASK, dtype=torch.long,
                            device=anchor_tokens.device)
        tokens[..., 0] = anchor_tokens
        return tokens.flatten(-2)

    def train_forward(self, features: torch.Tensor, tokens: torch.Tensor,
                      anchors: torch.Tensor) -> torch.Tensor:
        """Many blocks at once: features [B, T, K*H] of tokens [B, T], anchors [B, A]; block j
        of a sequence sees the context strictly before its anchor and its own block both ways.
        Returns logits [B, A, block, V]."""
        batch, length = tokens.shape
        block = self.shape.block
        count = anchors.shape[1]
        embed, _ = self.target_parts
        blk = self.block_input(torch.gather(tokens, 1, anchors))
        pos = (anchors[:, :, None] + torch.arange(block, device=tokens.device)).flatten(1)
        ctx_pos = torch.arange(length, device=tokens.device).expand(batch, length)
        query_anchor = anchors.repeat_interleave(block, dim=1)  # [B, A*block]
        see_ctx = ctx_pos[:, None, :] < query_anchor[:, :, None]
        block_id = torch.arange(count, device=tokens.device).repeat_interleave(block)
        see_blk = (block_id[:, None] == block_id[None, :]).expand(batch, -1, -1)
        mask = torch.cat([see_ctx, see_blk], dim=-1)[:, None]  # [B, 1, A*block, T + A*block]
        logits = self._layers(embed(blk), pos[:, None], self.context(features), ctx_pos[:, None],
                              mask)
        return logits.view(batch, count, block, -1)

    def serve_forward(self, features: torch.Tensor, anchor_token: int, anchor: int) -> torch.Tensor:
        """One request's draft step as DFlashWorkerV2 runs it: the committed tokens 0..anchor-1
        enter the draft KV cache (kv_proj_only on the projected features, k_norm, rope at
        their positions), the block [anchor token, mask...] at positions anchor.. attends to
        them and to itself with no mask. features [T, K*H] (rows past anchor-1 unused).
        Returns logits [block, V]."""
        block = self.shape.block
        device = features.device
        ctx = self.context(features[:anchor])
        ctx_pos = torch.arange(anchor, device=device)
        embed, _ = self.target_parts
        blk = self.block_input(torch.tensor([anchor_token], device=device))
        pos = torch.arange(anchor, anchor + block, device=device)
        return self._layers(embed(blk), pos, ctx, ctx_pos, None)

    def checkpoint(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {"fc.weight": self.fc.weight,
                                        "hidden_norm.weight": self.hidden_norm,
                                        "norm.weight": self.norm}
        for i, layer in enumerate(self.layers):
            out.update(_layer_tensors(layer, f"layers.{i}."))
        return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def block_loss(logits: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
               gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on block positions 1..block-1 against the tokens that follow each anchor,
    weighted exp(-(k-1)/gamma); also the share of position-1 predictions that are right."""
    block = logits.shape[2]
    offsets = torch.arange(1, block, device=tokens.device)
    want = torch.gather(tokens, 1, (anchors[:, :, None] + offsets).flatten(1)).view(
        *anchors.shape, block - 1)
    pred = logits[:, :, 1:].float()
    loss = F.cross_entropy(pred.flatten(0, 2), want.flatten(), reduction="none").view_as(want)
    weight = torch.exp(-(offsets - 1).float() / gamma)
    total = (loss * weight).sum(-1) / weight.sum()
    return total.mean(), (pred[:, :, 0].argmax(-1) == want[:, :, 0]).float().mean()


def accept_lengths(logits: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Per anchor, 1 + the number of leading draft tokens equal to the target's own greedy
    tokens: the accept length DFLASH gets from that block at temperature 0."""
    block = logits.shape[2]
    offsets = torch.arange(1, block, device=tokens.device)
    want = torch.gather(tokens, 1, (anchors[:, :, None] + offsets).flatten(1)).view(
        *anchors.shape, block - 1)
    right = (logits[:, :, 1:].argmax(-1) == want).int()
    return 1 + right.cumprod(-1).sum(-1)


# -- the corpus -------------------------------------------------------------------------------

def corpus_files() -> list[Path]:
    roots = sorted({Path(sysconfig.get_paths()[key]) for key in ("stdlib", "purelib")})
    files: set[Path] = set()
    for root in roots:
        if root.is_dir():
            files.update(p for p in root.rglob("*.py") if p.is_file())
    return sorted(files)


def held_out(path: Path) -> bool:
    return hashlib.sha256(str(path).encode()).digest()[0] % 16 == 0


def encode(text: bytes) -> list[int]:
    return [BYTE_OFFSET + b for b in text]


def decode(ids: list[int]) -> bytes:
    return bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < BYTE_OFFSET + 256)


def read_corpus(files: list[Path], limit: int) -> tuple[torch.Tensor, int]:
    """The files' bytes, each followed by [EOS], up to `limit` tokens; the number of files read."""
    chunks, total, used = [], 0, 0
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not data:
            continue
        ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int16) + BYTE_OFFSET
        chunks.append(torch.cat([ids, torch.tensor([EOS], dtype=torch.int16)]))
        total += len(ids) + 1
        used += 1
        if total >= limit:
            break
    return torch.cat(chunks)[:limit], used


def distinct_4grams(rows: list[list[int]]) -> float:
    grams = [tuple(r[i:i + 4]) for r in rows for i in range(len(r) - 3)]
    return len(set(grams)) / max(1, len(grams))


# -- training -------------------------------------------------------------------------------

def lr_at(step: int, steps: int, peak: float, decay_from: int) -> float:
    """Warmup 5 %, flat, then linear decay to 10 % from `decay_from` (moved earlier when the
    time budget runs short)."""
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    if step < decay_from:
        return peak
    return peak * max(0.1, 1 - 0.9 * (step - decay_from) / max(1, steps - decay_from))


def train_target(target: Target, data: torch.Tensor, valid: torch.Tensor, steps: int,
                 budget: Budget, seconds: float, seed: int, log: list[str]) -> dict[str, Any]:
    device = next(target.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(target.parameters(), lr=budget.target_lr, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=device.type == "cuda")
    began, decay_from, losses, step = time.time(), int(steps * 0.8), [], 0
    seq, batch = budget.seq, budget.target_batch
    data, span = data.to(device), torch.arange(seq + 1)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    for step in range(steps):
        elapsed = time.time() - began
        if step == decay_from or (decay_from > step and elapsed > 0.8 * seconds):
            decay_from = step
            steps = min(steps, step + max(1, int(step * 0.25)))
        if step >= steps or elapsed > seconds:
            break
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator)
        chunk = data[(starts[:, None] + span).to(device)].long()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, budget.target_lr, decay_from)
        with amp:
            logits, _ = target(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            losses.append(round(loss.item(), 4))
            log.append(f"target step {step} loss {losses[-1]} {time.time() - began:.0f} s")
            print(log[-1], flush=True)
    trained_s = time.time() - began
    target.eval()
    count = min((len(valid) - 1) // seq, 256)
    chunks = valid[:count * seq + 1].to(device).long()
    chunks = chunks[torch.arange(count, device=device)[:, None] * seq + span.to(device)]
    with torch.no_grad(), amp:
        vloss = [F.cross_entropy(target(part[:, :-1])[0].float().flatten(0, 1),
                                 part[:, 1:].flatten()).item() for part in chunks.split(32)]
    target.train()
    return {"steps": step, "seconds": round(trained_s, 1), "tokens": step * batch * seq,
            "loss_every_50": losses, "valid_loss": round(sum(vloss) / max(1, len(vloss)), 4),
            "valid_tokens": count * seq}


@torch.no_grad()
def greedy(target: Target, prompts: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy continuations of equal-length prompts [B, P] with a KV cache: [B, P + new]."""
    s = target.shape
    batch, length = prompts.shape
    total = length + new
    cache = [(torch.zeros(batch, s.kv_heads, total, s.head_dim, device=prompts.device,
                          dtype=target.embed_tokens.weight.dtype),
              torch.zeros(batch, s.kv_heads, total, s.head_dim, device=prompts.device,
                          dtype=target.embed_tokens.weight.dtype)) for _ in range(s.layers)]
    out = torch.empty(batch, total, dtype=torch.long, device=prompts.device)
    out[:, :length] = prompts
    logits, _ = target(prompts, cache=cache, start=0)
    for t in range(length, total):
        out[:, t] = logits[:, -1].argmax(-1)
        if t + 1 < total:
            logits, _ = target(out[:, t:t + 1], cache=cache, start=t)
    return out


@torch.no_grad()
def features_of(target: Target, tokens: torch.Tensor, ids: tuple[int, ...]) -> torch.Tensor:
    _, captured = target(tokens, capture=ids)
    return torch.cat(captured, dim=-1)


def train_drafter(drafter: Drafter, target: Target, sequences: torch.Tensor, start: int,
                  budget: Budget, seconds: float, log: list[str]) -> dict[str, Any]:
    """The block loss on the target's greedy text: anchors drawn among the generated tokens."""
    device = sequences.device
    ids = drafter.shape.target_layer_ids
    block = drafter.shape.block
    generator = torch.Generator(device="cpu").manual_seed(budget.seed + 7)
    feats = torch.cat([features_of(target, sequences[i:i + 64], ids)
                       for i in range(0, len(sequences), 64)])
    opt = torch.optim.AdamW(drafter.parameters(), lr=budget.drafter_lr, betas=(0.9, 0.95),
                            weight_decay=0.0, fused=device.type == "cuda")
    began, steps, decay_from, losses, accs, step = time.time(), budget.drafter_steps, int(
        budget.drafter_steps * 0.8), [], [], 0
    length = sequences.shape[1]
    for step in range(steps):
        elapsed = time.time() - began
        if step == decay_from or (decay_from > step and elapsed > 0.8 * seconds):
            decay_from = step
            steps = min(steps, step + max(1, int(step * 0.25)))
        if step >= steps or elapsed > seconds:
            break
        rows = torch.randint(0, len(sequences), (budget.drafter_batch,), generator=generator)
        anchors = torch.stack([torch.randperm(length - block - start, generator=generator)[
            :budget.anchors].sort().values + start for _ in rows]).to(device)
        rows = rows.to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, budget.drafter_lr, decay_from)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = drafter.train_forward(feats[rows], sequences[rows], anchors)
        loss, acc = block_loss(logits, sequences[rows], anchors, drafter.shape.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            losses.append(round(loss.item(), 4))
            accs.append(round(acc.item(), 3))
            log.append(f"drafter step {step} loss {losses[-1]} top1 {accs[-1]} "
                       f"{time.time() - began:.0f} s")
            print(log[-1], flush=True)
    return {"steps": step, "seconds": round(time.time() - began, 1),
            "blocks": step * budget.drafter_batch * budget.anchors,
            "loss_every_50": losses, "pos1_top1_every_50": accs}


@torch.no_grad()
def offline_accept(drafter: Drafter, target: Target, sequences: torch.Tensor, start: int) -> float:
    """DFLASH's accept length at temperature 0 on these greedy sequences, stepping as the
    engine does: from the first generated token, each step advances by its accept length."""
    block = drafter.shape.block
    length = sequences.shape[1]
    anchors = torch.arange(start, length - block, device=sequences.device)
    feats = features_of(target, sequences, drafter.shape.target_layer_ids)
    with torch.autocast(sequences.device.type, dtype=torch.bfloat16,
                        enabled=sequences.device.type == "cuda"):
        logits = drafter.train_forward(feats, sequences, anchors.expand(len(sequences), -1))
    per_anchor = accept_lengths(logits, sequences, anchors.expand(len(sequences), -1)).tolist()
    steps, tokens = 0, 0
    for row in per_anchor:
        i = 0
        while i < len(row):
            steps += 1
            tokens += row[i]
            i += row[i]
    return tokens / max(1, steps)


# -- writing model folders -------------------------------------------------------------------

def write_tokenizer(folder: Path, context: int) -> None:
    """Byte-level: the 18 special tokens of models.SPECIALS, then the 256 bytes (id 18 + b),
    no merges: every byte one token, any text encodable."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    sys.path.insert(0, str(HERE))
    from models import CHAT_TEMPLATE, SPECIALS

    assert len(SPECIALS) == SPECIAL_COUNT and SPECIALS[MASK] == "<|MASK|>"
    alphabet = ByteLevel.alphabet()
    byte_char = _bytes_to_unicode()
    assert sorted(alphabet) == sorted(byte_char.values())
    vocab = {token: index for index, token in enumerate(SPECIALS)}
    for b in range(256):
        vocab[byte_char[b]] = BYTE_OFFSET + b
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    sample = "def f(x):\n    return x  # é ✓\n"
    if tokenizer.encode(sample).ids != encode(sample.encode()):
        raise SystemExit("the byte-level tokenizer does not give 18 + byte")
    special = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
               "unk_token": "[UNK]", "mask_token": "<|MASK|>"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special, "add_bos_token": False,
              "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": context, "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=1))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character table, which tokenizers' ByteLevel uses."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def target_config(s: TargetShape) -> dict[str, Any]:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
            "head_dim": s.head_dim, "hidden_act": "silu", "hidden_size": s.hidden,
            "intermediate_size": s.inner, "initializer_range": 0.02,
            "max_position_embeddings": s.max_positions, "max_window_layers": s.layers,
            "num_attention_heads": s.heads, "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads, "rms_norm_eps": s.eps, "rope_scaling": None,
            "rope_theta": s.rope_theta, "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
            "vocab_size": s.vocab}


def drafter_config(d: DrafterShape, s: TargetShape) -> dict[str, Any]:
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "attention_bias": False, "attention_dropout": 0.0, "block_size": d.block,
            "dflash_config": {"mask_token": "<|MASK|>", "mask_token_id": MASK,
                              "target_layer_ids": list(d.target_layer_ids)},
            "num_target_layers": s.layers, "bos_token_id": BOS, "eos_token_id": EOS,
            "head_dim": d.head_dim, "hidden_act": "silu", "hidden_size": s.hidden,
            "intermediate_size": d.inner, "layer_types": ["full_attention"] * d.layers,
            "max_position_embeddings": s.max_positions, "max_window_layers": d.layers,
            "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads,
            "num_hidden_layers": d.layers, "rms_norm_eps": s.eps, "rope_scaling": None,
            "rope_theta": d.rope_theta, "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
            "vocab_size": s.vocab}


def write_folder(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                 context: int) -> dict[str, Any]:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False}, indent=1))
    path = folder / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    write_tokenizer(folder, context)
    return {"tensors": len(tensors), "params_m": round(sum(t.numel() for t in tensors.values()) / 1e6, 2),
            "mb": round(path.stat().st_size / 1e6, 1),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


def heldout_prompts(files: list[Path], count: int, size: int, seed: int) -> list[str]:
    """Prompts cut from held-out files at line starts, `size` bytes of ASCII each."""
    rng = random.Random(seed)
    prompts: list[str] = []
    pool = [p for p in files if p.stat().st_size > 4 * size]
    rng.shuffle(pool)
    for path in pool:
        text = path.read_bytes()
        lines = [i + 1 for i, b in enumerate(text[:-size]) if b == 10]
        if not lines:
            continue
        at = rng.choice(lines)
        cut = text[at:at + size]
        if cut.isascii() and cut.strip():
            prompts.append(cut.decode())
        if len(prompts) == count:
            break
    return prompts


# -- the whole run ---------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=Budget.seconds)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--target-share", type=float, default=Budget.target_share,
                        help="share of --seconds for the target's training")
    parser.add_argument("--b-steps", type=int, default=Budget.target_b_steps,
                        help="steps of the second target (the wrong pair's)")
    parser.add_argument("--prompts", type=int, default=Budget.prompts,
                        help="the drafter's data: prompts the target continues")
    parser.add_argument("--drafter-min-s", type=float, default=Budget.drafter_min_s,
                        help="seconds the drafter trains at least, the budget overrun if need be")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes and steps on whatever device there is: the whole road "
                             "in seconds, for trying this file where there is no GPU")
    args = parser.parse_args()
    began = time.time()
    budget = Budget(seconds=args.seconds, target_share=args.target_share,
                    target_b_steps=args.b_steps, prompts=args.prompts,
                    drafter_min_s=args.drafter_min_s)
    shape, dshape = TargetShape(), DrafterShape()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    corpus_limit = 120_000_000
    if args.smoke:
        shape = TargetShape(layers=4, hidden=32, heads=4, kv_heads=2, head_dim=8, inner=64)
        dshape = DrafterShape(layers=1, block=4, target_layer_ids=(0, 2), heads=4, kv_heads=2,
                              head_dim=8, inner=64)
        budget = Budget(seconds=args.seconds, target_share=args.target_share, seq=32,
                        target_batch=4, target_steps=20,
                        target_b_steps=5, prompts=8, prompt_len=16, rollout=16, drafter_batch=4,
                        anchors=4, drafter_steps=10, heldout_prompts=4, heldout_prompt_bytes=32)
        corpus_limit = 200_000
    log: list[str] = []
    report: dict[str, Any] = {"budget": asdict(budget), "target_shape": asdict(shape),
                              "drafter_shape": asdict(dshape), "log": log}

    files = corpus_files()
    train_files = [p for p in files if not held_out(p)]
    test_files = [p for p in files if held_out(p)]
    # Target A reads the training files in order (one pass at most: 120 M tokens is more than
    # its time budget trains on), B from the other end of the list (other files where the
    # corpus is larger than A's share) with its own seed.
    data_a, used_a = read_corpus(train_files, limit=corpus_limit)
    data_b, used_b = read_corpus(train_files[::-1], limit=corpus_limit // 12)
    valid, used_v = read_corpus(test_files, limit=corpus_limit // 60)
    report["corpus"] = {
        "roots": sorted({sysconfig.get_paths()[k] for k in ("stdlib", "purelib")}),
        "files": len(files), "train_files": len(train_files), "heldout_files": len(test_files),
        "a_files_read": used_a, "a_tokens": len(data_a), "b_files_read": used_b,
        "b_tokens": len(data_b), "valid_files_read": used_v, "valid_tokens": len(valid),
        "first_files": [str(p) for p in train_files[:3]],
        "list_sha256": hashlib.sha256("\n".join(map(str, files)).encode()).hexdigest()[:16]}
    print(json.dumps(report["corpus"]), flush=True)

    # Shares of the time budget: target A 55 %, B 8 % (unless set), rollouts and drafter the
    # rest.
    torch.manual_seed(budget.seed)
    target = Target(shape).to(device)
    _init(target, budget.seed)
    report["target"] = train_target(target, data_a, valid, budget.target_steps, budget,
                                    budget.target_share * budget.seconds, budget.seed, log)
    # bf16 from here on, as the engine runs it (kept float32 on a CPU, which has no autocast here).
    serve_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = target.to(serve_dtype)
    torch.manual_seed(budget.seed + 1)
    other = Target(shape).to(device)
    _init(other, budget.seed + 1)
    report["target_b"] = train_target(other, data_b, valid, budget.target_b_steps, budget,
                                      budget.b_share * budget.seconds, budget.seed + 1, log)
    other = other.to(serve_dtype)

    # The target's own greedy text from training-file prompts (the drafter's data).
    generator = torch.Generator().manual_seed(budget.seed + 2)
    starts = torch.randint(0, len(data_a) - budget.prompt_len, (budget.prompts,), generator=generator)
    prompts = torch.stack([data_a[s:s + budget.prompt_len] for s in starts.tolist()]).long().to(device)
    t0 = time.time()
    sequences = torch.cat([greedy(target, prompts[i:i + 512], budget.rollout)
                           for i in range(0, len(prompts), 512)])
    report["rollouts"] = {"sequences": len(sequences), "prompt_len": budget.prompt_len,
                          "new_tokens": budget.rollout, "seconds": round(time.time() - t0, 1),
                          "distinct_4grams": round(distinct_4grams(
                              sequences[:, budget.prompt_len:].tolist()), 3)}
    print(json.dumps(report["rollouts"]), flush=True)

    torch.manual_seed(budget.seed + 3)
    drafter = Drafter(dshape, target).to(device)
    _init(drafter, budget.seed + 3)
    # What is left of the budget, and never less than `drafter_min_s`: a drafter with no steps
    # accepts nothing (the whole budget then runs over by at most that much).
    left = max(budget.seconds - (time.time() - began) - 40, budget.drafter_min_s)
    report["drafter"] = train_drafter(drafter, target, sequences, budget.prompt_len, budget,
                                      left, log)

    # Held-out: prompts from held-out files only; the target's greedy rollouts of them, the
    # drafter's accept length on those, and the wrong pair's.
    held = heldout_prompts(test_files, budget.heldout_prompts, budget.heldout_prompt_bytes,
                           budget.seed + 4)
    held_ids = torch.tensor([encode(p.encode())[:budget.heldout_prompt_bytes] for p in held
                             if len(p.encode()) >= budget.heldout_prompt_bytes], device=device)
    drafter.eval()
    new = 256 if not args.smoke else 16
    roll = greedy(target, held_ids[:32], new)
    roll_b = greedy(other, held_ids[:32], new)
    start = held_ids.shape[1]  # the first generated token: the first block's anchor
    wrong = Drafter(dshape, other).to(device)
    wrong.load_state_dict(drafter.state_dict())
    report["heldout"] = {
        "prompts": len(held), "prompt_bytes": budget.heldout_prompt_bytes, "new_tokens": new,
        "accept_length": round(offline_accept(drafter, target, roll, start), 3),
        "distinct_4grams": round(distinct_4grams(roll[:, start:].tolist()), 3),
        "wrong_pair_accept_length": round(offline_accept(wrong, other, roll_b, start), 3),
        "wrong_pair_distinct_4grams": round(distinct_4grams(roll_b[:, start:].tolist()), 3),
        "sample": decode(roll[0, start:start + 160].tolist()).decode("utf-8", "replace")}
    print(json.dumps(report["heldout"]), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    report["folders"] = {
        "trained-target": write_folder(args.out / "trained-target", target_config(shape),
                                       target.checkpoint(), shape.max_positions),
        "trained-target-b": write_folder(args.out / "trained-target-b", target_config(shape),
                                         other.checkpoint(), shape.max_positions),
        "trained-dflash": write_folder(args.out / "trained-dflash", drafter_config(dshape, shape),
                                       drafter.checkpoint(), shape.max_positions)}
    with open(args.out / "trained-target" / "heldout.jsonl", "w") as handle:
        for prompt in held:
            handle.write(json.dumps({"prompt": prompt}) + "\n")
    report["seconds"] = round(time.time() - began, 1)
    report["device"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    text = json.dumps(report, indent=1)
    (args.out / "train.json").write_text(text)
    if args.report:
        args.report.write_text(text)
    print(f"trained in {report['seconds']} s", flush=True)


def _init(model: nn.Module, seed: int) -> None:
    """Seeded init: normal(0, 0.02) for matrices (output projections scaled down by depth),
    ones for norms."""
    generator = torch.Generator().manual_seed(seed)
    depth = sum(1 for name, _ in model.named_parameters() if name.endswith("o_proj.weight"))
    for name, param in model.named_parameters():
        if param.dim() == 1:
            continue
        std = 0.02 / math.sqrt(2 * depth) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
        with torch.no_grad():
            param.copy_(torch.randn(param.shape, generator=generator) * std)


if __name__ == "__main__":
    main()
