"""Parallelism rules: GPU count, tp/ep sizes against the model, drafter against target."""

from __future__ import annotations

from appliance.engine.model_config import is_mla
from appliance.engine.spec import DFLASH_FAMILY
from appliance.preflight.types import Context, Finding, findings


def rule_parallel_gpu_count(ctx: Context) -> list[Finding]:
    e, have = ctx.engine, len(ctx.spec.gpus)
    # Attention DP runs inside the TP group, so it adds no GPUs (sglang compute_world_size).
    dp = 1 if e.enable_dp_attention else e.dp_size
    need = e.tp_size * dp * e.pp_size
    product = f"tp {e.tp_size} x dp {dp} x pp {e.pp_size} = {need}"
    if e.tp_size % e.ep_size:
        return findings("parallel-gpu-count", "error", "engine.ep_size",
                        f"ep_size {e.ep_size} must divide tp_size {e.tp_size}",
                        f"set ep_size to a divisor of {e.tp_size}")
    if need > have:
        return findings("parallel-gpu-count", "error", "gpus",
                        f"{product} GPUs needed but {have} assigned",
                        f"assign {need} GPUs or lower tp_size")
    if need < have:
        return findings("parallel-gpu-count", "warning", "gpus",
                        f"{product} GPUs used but {have} assigned; {have - need} stay idle",
                        f"assign {need} GPUs or raise tp_size to {have // (dp * e.pp_size)}")
    return []


def _divides(rule: str, fld: str, what: str, count: int, size: int, name: str) -> list[Finding]:
    if count % size == 0:
        return []
    divisors = [d for d in range(1, count + 1) if count % d == 0 and d <= 64]
    return findings(rule, "error", fld, f"{name}={size} does not divide the model's {count} {what}",
                    f"use a {name} in {divisors}")


def rule_tp_divides_model(ctx: Context) -> list[Finding]:
    m, e = ctx.model, ctx.engine
    if m is None:
        return []
    found: list[Finding] = []
    heads = m.get("num_attention_heads")
    if isinstance(heads, int):
        found += _divides("tp-divides-model", "engine.tp_size", "attention heads", heads,
                          e.tp_size, "tp_size")
    kv = m.get("num_key_value_heads")
    if isinstance(kv, int) and not is_mla(m) and kv >= e.tp_size:
        found += _divides("tp-divides-model", "engine.tp_size", "KV heads", kv, e.tp_size,
                          "tp_size")
    experts = m.get("n_routed_experts") or m.get("num_experts") or m.get("num_local_experts")
    if isinstance(experts, int) and e.ep_size > 1:
        found += _divides("tp-divides-model", "engine.ep_size", "routed experts", experts,
                          e.ep_size, "ep_size")
    return found


def rule_drafter_matches_target(ctx: Context) -> list[Finding]:
    m, d = ctx.model, ctx.drafter
    if m is None or d is None or ctx.algorithm not in DFLASH_FAMILY:
        return []
    fld = "engine.speculative_draft_model_path"
    found: list[Finding] = []
    for key in ("vocab_size", "hidden_size"):
        if m.get(key) is not None and d.get(key) is not None and m[key] != d[key]:
            found += findings("drafter-matches-target", "error", fld,
                              f"drafter {key} {d[key]} differs from the target's {m[key]}",
                              "use the drafter trained for this target model")
    layers = m.get("num_hidden_layers")
    sub = d.get("dflash_config") or {}
    ids = sub.get("target_layer_ids", d.get("target_layer_ids"))
    if isinstance(layers, int) and isinstance(ids, list):
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < layers]
        if bad:
            found += findings("drafter-matches-target", "error", fld,
                              f"drafter target_layer_ids {bad} are outside the target's "
                              f"{layers} layers (0..{layers - 1})",
                              "use the drafter trained for this target model")
    trained = sub.get("num_target_layers", d.get("num_target_layers"))
    if isinstance(layers, int) and isinstance(trained, int) and trained != layers:
        found += findings("drafter-matches-target", "warning", fld,
                          f"drafter was trained on a {trained}-layer target; this one has "
                          f"{layers}", "check the drafter belongs to this model")
    return found
