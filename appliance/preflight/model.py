"""Target model rules: custom code, context length, and whether the weights fit in GPU memory."""

from __future__ import annotations

from appliance.engine.launch import launch_args
from appliance.preflight.types import Context, Finding, findings

GIB = 1024**3


def rule_trust_remote_code(ctx: Context) -> list[Finding]:
    if ctx.model is None or not ctx.model.get("auto_map") or ctx.engine.trust_remote_code:
        return []
    return findings("trust-remote-code", "error", "engine.trust_remote_code",
                    "the model ships custom code (auto_map in config.json) and the engine "
                    "refuses to load it without trust_remote_code",
                    "set trust_remote_code: true")


def rule_context_length(ctx: Context) -> list[Finding]:
    wanted, limit = ctx.engine.context_length, (ctx.model or {}).get("max_position_embeddings")
    if wanted is None or not isinstance(limit, int) or wanted <= limit:
        return []
    allowed = launch_args(ctx.spec).env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") == "1"
    if allowed:
        return findings("context-length", "warning", "engine.context_length",
                        f"context_length {wanted} exceeds the model's max_position_embeddings "
                        f"{limit}; outputs past {limit} tokens may degrade",
                        f"set context_length to {limit} or less")
    return findings("context-length", "error", "engine.context_length",
                    f"context_length {wanted} exceeds the model's max_position_embeddings {limit}; "
                    "SGLang refuses to start", f"set context_length to {limit} or less")


def rule_gpu_memory(ctx: Context) -> list[Finding]:
    if ctx.weights_bytes is None or ctx.gpu_memory_gb is None:
        return []
    e = ctx.engine
    shards = e.tp_size * e.pp_size
    weights = (ctx.weights_bytes + (ctx.drafter_weights_bytes or 0)) / shards / GIB
    frac = e.mem_fraction_static or 0.9
    budget = ctx.gpu_memory_gb * frac
    room = budget - weights
    usage = (f"weights {weights:.1f} GB per GPU (over {shards} GPUs) against "
             f"{budget:.1f} GB static memory ({frac:.2f} x {ctx.gpu_memory_gb:.0f} GB)")
    if room < 0:
        return findings("gpu-memory", "error", "engine.tp_size", f"{usage}: does not fit",
                        "use more GPUs (tp_size), a quantized checkpoint, or a larger GPU")
    # KV cache for a few long requests plus CUDA graph buffers need several GB per GPU.
    headroom = max(4.0, 0.05 * ctx.gpu_memory_gb)
    if room < headroom:
        return findings("gpu-memory", "warning", "engine.mem_fraction_static",
                        f"{usage}: only {room:.1f} GB left for KV cache and CUDA graphs",
                        "raise mem_fraction_static, lower cuda_graph_max_bs, or add GPUs")
    return findings("gpu-memory", "info", "engine", f"{usage}: {room:.1f} GB left for KV cache",
                    "nothing to do")
