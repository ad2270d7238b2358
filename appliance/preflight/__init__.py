"""Pre-flight rules: catch a bad deployment in a second instead of after a 6-minute model load.

Each rule is a small function with a stable id (the key in RULES) and tests for firing and for
staying quiet. Facts come from SGLang 0.5.23's argument handling (arg_groups/speculative_hook.py,
speculative/dflash_utils.py) and from the DDTree PR #27509 source.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from appliance import selfcheck
from appliance.engine.flags import closest_flag, flags_in_argv, load_flags
from appliance.engine.recipes import Recipe, RecipeError, load_recipe
from appliance.engine.spec import (
    DFLASH_FAMILY,
    SECRET_NAME,
    SECRET_VALUE,
    DeploymentSpec,
    EngineOptions,
    flag_for,
    launch_args,
)

Severity = Literal["error", "warning", "info"]
VERIFY_WIDTH_PATCH = "ddtree-verify-graph-width"
# Attention backends that take a tree (custom) mask in target verify.
TREE_BACKENDS = ("fa3", "triton", "flashinfer")
DFLASH_DEFAULT_BLOCK = 16  # SGLang's fallback when neither flag nor drafter config says
DFLASH_MAX_RUNNING_DEFAULT = 48  # _handle_dflash's cap when --max-running-requests is unset
NEEDS_DRAFT_MODEL = ("EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "DDTREE")
GIB = 1024**3


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    field: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass
class Context:
    """Everything the rules may look at; None where unknown (rules then stay quiet)."""

    spec: DeploymentSpec
    recipe: Recipe | None = None
    model: dict[str, Any] | None = None  # the target's text config
    drafter: dict[str, Any] | None = None
    gpu_memory_gb: float | None = None
    weights_bytes: int | None = None
    drafter_weights_bytes: int | None = None
    flags: frozenset[str] | None = None
    notes: list[Finding] = field(default_factory=list)

    @property
    def engine(self) -> EngineOptions:
        return self.spec.engine

    @property
    def algorithm(self) -> str:
        return self.engine.speculative_algorithm


# ---------------------------------------------------------------- helpers

def text_config(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """Multimodal checkpoints (Kimi K2.5/K2.6) nest the language model under text_config."""
    if config is None:
        return None
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def is_mla(model: dict[str, Any] | None) -> bool | None:
    if model is None:
        return None
    if model.get("kv_lora_rank"):
        return True
    arch = " ".join(model.get("architectures") or []) + " " + str(model.get("model_type", ""))
    return bool(re.search(r"deepseek_?v[23]|kimi_?k2", arch, re.IGNORECASE))


def drafter_block_size(drafter: dict[str, Any] | None) -> int | None:
    """As sglang's parse_dflash_draft_config: dflash_config.block_size, else top-level."""
    if drafter is None:
        return None
    sub = drafter.get("dflash_config") or {}
    value = sub.get("block_size", drafter.get("block_size"))
    return int(value) if value is not None else None


def block_size(ctx: Context) -> int | None:
    e = ctx.engine
    return e.speculative_num_draft_tokens or e.speculative_dflash_block_size or \
        drafter_block_size(ctx.drafter)


def ddtree_budget(ctx: Context) -> int | None:
    """The PR's rule: --speculative-ddtree-budget, else block size minus 1."""
    if ctx.engine.speculative_ddtree_budget is not None:
        return ctx.engine.speculative_ddtree_budget
    block = block_size(ctx)
    return block - 1 if block else None


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    nums = re.findall(r"\d+", text.split("+")[0])
    return tuple(int(n) for n in nums[:3]) if nums else None


def _finding(rule: str, severity: Severity, fld: str, message: str, fix: str) -> list[Finding]:
    return [Finding(rule, severity, fld, message, fix)]


# ---------------------------------------------------------------- speculative decoding rules

def rule_ddtree_verify_width(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DDTREE" or ctx.engine.disable_cuda_graph or ctx.recipe is None:
        return []
    block, budget = block_size(ctx), ddtree_budget(ctx)
    if block is None or budget is None:
        return []
    if VERIFY_WIDTH_PATCH in ctx.recipe.patches:
        return _finding("ddtree-verify-width", "info", "recipe",
                        f"target verify CUDA graph width {budget + 1} (budget+1), draft graph "
                        f"width {block} (block size), via the {VERIFY_WIDTH_PATCH} patch",
                        "nothing to do")
    return _finding(
        "ddtree-verify-width", "error", "recipe",
        f"recipe {ctx.recipe.name!r} lacks the {VERIFY_WIDTH_PATCH} patch: the target verify "
        f"CUDA graph is captured at the block size ({block} tokens per request) but DDTree "
        f"verifies budget+1 = {budget + 1}; replay fails with 'The size of tensor a ({block}) "
        f"must match the size of tensor b ({budget + 1})' after the full model load "
        "(newer SGLang silently falls back to eager verify instead)",
        f"use a recipe with the {VERIFY_WIDTH_PATCH} patch (kimi-k2.6-ddtree), or set "
        "engine.disable_cuda_graph: true and accept eager verify")


def rule_ddtree_budget(ctx: Context) -> list[Finding]:
    budget = ctx.engine.speculative_ddtree_budget
    if ctx.algorithm != "DDTREE":
        if budget is None:
            return []
        return _finding("ddtree-budget", "warning", "engine.speculative_ddtree_budget",
                        f"a DDTree budget is set but the algorithm is {ctx.algorithm}; "
                        "SGLang ignores it", "remove it or set speculative_algorithm: DDTREE")
    if budget is not None and budget < 1:
        return _finding("ddtree-budget", "error", "engine.speculative_ddtree_budget",
                        f"the tree budget must be at least 1, got {budget}",
                        "set speculative_ddtree_budget to 1 or more (e.g. 32)")
    block = block_size(ctx)
    if budget is None and block:
        return _finding("ddtree-budget", "info", "engine.speculative_ddtree_budget",
                        f"no budget set: DDTree uses block size - 1 = {block - 1} tree nodes",
                        "set speculative_ddtree_budget to verify a wider tree (e.g. 32)")
    return []


def rule_tree_attention_backend(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DDTREE":
        return []
    backend, mla = ctx.engine.attention_backend, is_mla(ctx.model)
    fld = "engine.attention_backend"
    if backend is None:
        return _finding("tree-attention-backend", "warning", fld,
                        "no attention backend set: SGLang picks one per GPU and model, and not "
                        "every backend takes DDTree's tree mask",
                        "set attention_backend: fa3 (or triton)")
    if backend not in TREE_BACKENDS:
        return _finding("tree-attention-backend", "error", fld,
                        f"attention backend {backend!r} cannot verify a draft tree (no tree mask)",
                        "use fa3 or triton (flashinfer only for non-MLA models)")
    if backend == "flashinfer" and mla:
        return _finding("tree-attention-backend", "error", fld,
                        "FlashInfer's MLA backend supports only topk=1 (chain) speculative "
                        "decoding; this model uses MLA, so DDTree's tree verify cannot run",
                        "use attention_backend: fa3 (Hopper) or triton")
    if backend == "flashinfer" and mla is None:
        return _finding("tree-attention-backend", "warning", fld,
                        "flashinfer takes a tree mask only on non-MLA models and the model "
                        "config could not be read", "use fa3 or triton for MLA models")
    return []


def rule_dflash_dp_attention(ctx: Context) -> list[Finding]:
    e = ctx.engine
    if ctx.algorithm not in DFLASH_FAMILY or not e.enable_dp_attention:
        return []
    fld = "engine.enable_dp_attention"
    if ctx.algorithm == "DDTREE":
        return _finding("dflash-dp-attention", "error", fld,
                        "DDTree's worker extends this source's DFlashWorker, which does not "
                        "support dp attention", "remove enable_dp_attention")
    version = _version(ctx.recipe.sglang_version if ctx.recipe else None)
    if version is not None and version < (0, 5, 23):
        return _finding("dflash-dp-attention", "error", fld,
                        "DFLASH does not support dp attention before SGLang 0.5.23",
                        "remove enable_dp_attention, or use SGLang 0.5.23 with enable_dp_lm_head")
    if not e.enable_dp_lm_head:
        return _finding("dflash-dp-attention", "error", fld,
                        "DFLASH with dp attention requires --enable-dp-lm-head (SGLang raises "
                        "at start-up)",
                        "set enable_dp_lm_head: true, or remove enable_dp_attention")
    return []


def rule_dflash_pipeline_parallel(ctx: Context) -> list[Finding]:
    if ctx.algorithm not in DFLASH_FAMILY or ctx.engine.pp_size == 1:
        return []
    return _finding("dflash-pipeline-parallel", "error", "engine.pp_size",
                    f"{ctx.algorithm} speculative decoding only supports pp_size == 1, got "
                    f"{ctx.engine.pp_size}", "set pp_size: 1 and use tp_size for the GPUs")


def _flag_disagreement(e: EngineOptions) -> list[Finding]:
    nd, bs = e.speculative_num_draft_tokens, e.speculative_dflash_block_size
    if nd is None or bs is None or nd == bs:
        return []
    return _finding("block-size-agreement", "error", "engine.speculative_dflash_block_size",
                    f"speculative_num_draft_tokens={nd} and speculative_dflash_block_size={bs} "
                    "differ; for DFLASH they must match", "set only one of them")


def _drafter_disagreement(ctx: Context, block: int, trained: int) -> list[Finding]:
    fld = "engine.speculative_num_draft_tokens"
    if block > trained:
        return _finding("block-size-agreement", "error", fld,
                        f"block size {block} is larger than the drafter's trained block size "
                        f"{trained} (its config.json)",
                        f"set speculative_num_draft_tokens: {trained}")
    return _finding("block-size-agreement", "warning", fld,
                    f"block size {block} is smaller than the drafter's trained block size "
                    f"{trained}: fewer tokens can be accepted per step",
                    f"set speculative_num_draft_tokens: {trained} unless this is deliberate")


def rule_block_size_agreement(ctx: Context) -> list[Finding]:
    if ctx.algorithm not in DFLASH_FAMILY:
        return []
    found = _flag_disagreement(ctx.engine)
    block = ctx.engine.speculative_num_draft_tokens or ctx.engine.speculative_dflash_block_size
    trained = drafter_block_size(ctx.drafter)
    if block and trained and block != trained:
        found += _drafter_disagreement(ctx, block, trained)
    if block is None and ctx.algorithm == "DDTREE":
        found += _finding("block-size-agreement", "error", "engine.speculative_num_draft_tokens",
                          "DDTREE needs an explicit block size: the PR source does not run "
                          "DFLASH's argument handling that infers it from the drafter",
                          f"set speculative_num_draft_tokens: {trained or 8}")
    elif block is None:
        found += _finding("block-size-agreement", "info", "engine.speculative_num_draft_tokens",
                          f"block size comes from the drafter config ({trained}) or defaults to "
                          f"{DFLASH_DEFAULT_BLOCK}", "set speculative_num_draft_tokens to be sure")
    return found


def rule_speculative_draft_model(ctx: Context) -> list[Finding]:
    if ctx.algorithm not in NEEDS_DRAFT_MODEL or ctx.engine.speculative_draft_model_path:
        return []
    return _finding("speculative-draft-model", "error", "engine.speculative_draft_model_path",
                    f"{ctx.algorithm} speculative decoding requires a draft model path",
                    "set speculative_draft_model_path to the drafter's directory")


def rule_dflash_max_running_requests(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DFLASH" or ctx.engine.max_running_requests is not None:
        return []
    return _finding("dflash-max-running-requests", "info", "engine.max_running_requests",
                    f"DFLASH caps max running requests at {DFLASH_MAX_RUNNING_DEFAULT} when unset",
                    "set max_running_requests to serve more concurrent requests")


def rule_cuda_graph_disabled(ctx: Context) -> list[Finding]:
    if ctx.algorithm == "NONE" or not ctx.engine.disable_cuda_graph:
        return []
    return _finding("cuda-graph-disabled", "warning", "engine.disable_cuda_graph",
                    "CUDA graphs are off: every draft and verify step runs eager, which loses "
                    "most of the speculative speed-up", "remove disable_cuda_graph")


def rule_ddtree_overlap_schedule(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DDTREE" or ctx.engine.disable_overlap_schedule:
        return []
    return _finding("ddtree-overlap-schedule", "error", "engine.disable_overlap_schedule",
                    "DDTreeWorker raises 'DDTREE does not support overlap scheduling (spec v2)' "
                    "and the PR source does not disable the overlap scheduler for DDTREE",
                    "set disable_overlap_schedule: true")


def rule_algorithm_in_source(ctx: Context) -> list[Finding]:
    if ctx.flags is None or ctx.algorithm not in DFLASH_FAMILY:
        return []
    marker = {"DDTREE": "--speculative-ddtree-budget", "DFLASH": "--speculative-dflash-block-size"}
    if marker[ctx.algorithm] in ctx.flags:
        return []
    source = ctx.recipe.sglang_version or ctx.recipe.name if ctx.recipe else "this source"
    return _finding("algorithm-in-source", "error", "engine.speculative_algorithm",
                    f"SGLang {source} has no {ctx.algorithm} speculative decoding",
                    "use the kimi-k2.6-ddtree recipe" if ctx.algorithm == "DDTREE"
                    else "use SGLang 0.5.11 or newer")


# ---------------------------------------------------------------- parallelism and model rules

def rule_parallel_gpu_count(ctx: Context) -> list[Finding]:
    e, have = ctx.engine, len(ctx.spec.gpus)
    # Attention DP runs inside the TP group, so it adds no GPUs (sglang compute_world_size).
    dp = 1 if e.enable_dp_attention else e.dp_size
    need = e.tp_size * dp * e.pp_size
    product = f"tp {e.tp_size} x dp {dp} x pp {e.pp_size} = {need}"
    if e.tp_size % e.ep_size:
        return _finding("parallel-gpu-count", "error", "engine.ep_size",
                        f"ep_size {e.ep_size} must divide tp_size {e.tp_size}",
                        f"set ep_size to a divisor of {e.tp_size}")
    if need > have:
        return _finding("parallel-gpu-count", "error", "gpus",
                        f"{product} GPUs needed but {have} assigned",
                        f"assign {need} GPUs or lower tp_size")
    if need < have:
        return _finding("parallel-gpu-count", "warning", "gpus",
                        f"{product} GPUs used but {have} assigned; {have - need} stay idle",
                        f"assign {need} GPUs or raise tp_size to {have // (dp * e.pp_size)}")
    return []


def _divides(rule: str, fld: str, what: str, count: int, size: int, name: str) -> list[Finding]:
    if count % size == 0:
        return []
    divisors = [d for d in range(1, count + 1) if count % d == 0 and d <= 64]
    return _finding(rule, "error", fld, f"{name}={size} does not divide the model's {count} {what}",
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
            found += _finding("drafter-matches-target", "error", fld,
                              f"drafter {key} {d[key]} differs from the target's {m[key]}",
                              "use the drafter trained for this target model")
    layers = m.get("num_hidden_layers")
    sub = d.get("dflash_config") or {}
    ids = sub.get("target_layer_ids", d.get("target_layer_ids"))
    if isinstance(layers, int) and isinstance(ids, list):
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < layers]
        if bad:
            found += _finding("drafter-matches-target", "error", fld,
                              f"drafter target_layer_ids {bad} are outside the target's "
                              f"{layers} layers (0..{layers - 1})",
                              "use the drafter trained for this target model")
    trained = sub.get("num_target_layers", d.get("num_target_layers"))
    if isinstance(layers, int) and isinstance(trained, int) and trained != layers:
        found += _finding("drafter-matches-target", "warning", fld,
                          f"drafter was trained on a {trained}-layer target; this one has "
                          f"{layers}", "check the drafter belongs to this model")
    return found


def rule_trust_remote_code(ctx: Context) -> list[Finding]:
    if ctx.model is None or not ctx.model.get("auto_map") or ctx.engine.trust_remote_code:
        return []
    return _finding("trust-remote-code", "error", "engine.trust_remote_code",
                    "the model ships custom code (auto_map in config.json) and the engine "
                    "refuses to load it without trust_remote_code",
                    "set trust_remote_code: true")


def rule_context_length(ctx: Context) -> list[Finding]:
    wanted, limit = ctx.engine.context_length, (ctx.model or {}).get("max_position_embeddings")
    if wanted is None or not isinstance(limit, int) or wanted <= limit:
        return []
    allowed = launch_args(ctx.spec).env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") == "1"
    if allowed:
        return _finding("context-length", "warning", "engine.context_length",
                        f"context_length {wanted} exceeds the model's max_position_embeddings "
                        f"{limit}; outputs past {limit} tokens may degrade",
                        f"set context_length to {limit} or less")
    return _finding("context-length", "error", "engine.context_length",
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
        return _finding("gpu-memory", "error", "engine.tp_size", f"{usage}: does not fit",
                        "use more GPUs (tp_size), a quantized checkpoint, or a larger GPU")
    # KV cache for a few long requests plus CUDA graph buffers need several GB per GPU.
    headroom = max(4.0, 0.05 * ctx.gpu_memory_gb)
    if room < headroom:
        return _finding("gpu-memory", "warning", "engine.mem_fraction_static",
                        f"{usage}: only {room:.1f} GB left for KV cache and CUDA graphs",
                        "raise mem_fraction_static, lower cuda_graph_max_bs, or add GPUs")
    return _finding("gpu-memory", "info", "engine", f"{usage}: {room:.1f} GB left for KV cache",
                    "nothing to do")


# ---------------------------------------------------------------- argv rules

def _engine_flag_findings(ctx: Context, known: frozenset[str], source: str) -> list[Finding]:
    argv = launch_args(dataclasses.replace(ctx.spec, extra_args=[])).argv
    found: list[Finding] = []
    for _, flag in flags_in_argv(argv):
        if flag in known:
            continue
        name = flag[2:].replace("-", "_")
        close = closest_flag(flag, known)
        found += _finding("unknown-flag", "error", f"engine.{name}",
                          f"SGLang {source} has no {flag}",
                          f"did you mean {close}?" if close else f"remove {name}")
    return found


def rule_unknown_flag(ctx: Context) -> list[Finding]:
    known = ctx.flags
    if known is None:
        if ctx.recipe is None:
            return []
        return _finding("unknown-flag", "info", "extra_args",
                        f"no flag list for recipe {ctx.recipe.name!r}; flags not checked",
                        "generate one with bench/gen_sglang_flags.py")
    source = ctx.recipe.flag_list_name if ctx.recipe else "source"
    found = _engine_flag_findings(ctx, known, str(source))
    for i, flag in flags_in_argv(ctx.spec.extra_args):
        if flag not in known:
            close = closest_flag(flag, known)
            found += _finding("unknown-flag", "error", f"extra_args[{i}]",
                              f"SGLang {source} has no {flag}",
                              f"did you mean {close}?" if close else "remove it")
    return found


def rule_duplicate_flag(ctx: Context) -> list[Finding]:
    emitted = {flag for _, flag in flags_in_argv(launch_args(
        dataclasses.replace(ctx.spec, extra_args=[])).argv)}
    found: list[Finding] = []
    seen: set[str] = set()
    for i, flag in flags_in_argv(ctx.spec.extra_args):
        if flag in emitted:
            name = flag[2:].replace("-", "_")
            found += _finding("duplicate-flag", "error", f"extra_args[{i}]",
                              f"{flag} is already set from engine.{name}",
                              f"set engine.{name} instead and remove it from extra_args")
        elif flag in seen:
            found += _finding("duplicate-flag", "error", f"extra_args[{i}]",
                              f"{flag} appears twice in extra_args", "keep one")
        seen.add(flag)
    return found


def _secret_positions(argv: list[str]) -> Iterable[int]:
    for i, item in enumerate(argv):
        value = item.split("=", 1)[1] if item.startswith("--") and "=" in item else item
        after_secret_flag = i > 0 and argv[i - 1].startswith("--") and \
            bool(SECRET_NAME.search(argv[i - 1])) and "=" not in argv[i - 1]
        inline_secret_flag = item.startswith("--") and "=" in item and \
            bool(SECRET_NAME.search(item.split("=", 1)[0]))
        if SECRET_VALUE.match(value) or after_secret_flag or inline_secret_flag:
            yield i


def rule_secret_in_args(ctx: Context) -> list[Finding]:
    found: list[Finding] = []
    for i in _secret_positions(ctx.spec.extra_args):
        found += _finding("secret-in-args", "error", f"extra_args[{i}]",
                          "a token-like value is in the command line, where docker inspect, "
                          "ps and the logs show it", "store it as a secret and list its name "
                          "under secrets: (the runtime passes it as an env var)")
    for f in dataclasses.fields(EngineOptions):
        value = getattr(ctx.engine, f.name)
        if isinstance(value, str) and SECRET_VALUE.match(value):
            found += _finding("secret-in-args", "error", f"engine.{f.name}",
                              f"{flag_for(f.name)} holds a token-like value",
                              "store it as a secret and list its name under secrets:")
    return found


RULES: dict[str, Callable[[Context], list[Finding]]] = {
    "ddtree-verify-width": rule_ddtree_verify_width,
    "ddtree-budget": rule_ddtree_budget,
    "tree-attention-backend": rule_tree_attention_backend,
    "ddtree-overlap-schedule": rule_ddtree_overlap_schedule,
    "algorithm-in-source": rule_algorithm_in_source,
    "dflash-dp-attention": rule_dflash_dp_attention,
    "dflash-pipeline-parallel": rule_dflash_pipeline_parallel,
    "block-size-agreement": rule_block_size_agreement,
    "speculative-draft-model": rule_speculative_draft_model,
    "dflash-max-running-requests": rule_dflash_max_running_requests,
    "cuda-graph-disabled": rule_cuda_graph_disabled,
    "parallel-gpu-count": rule_parallel_gpu_count,
    "tp-divides-model": rule_tp_divides_model,
    "drafter-matches-target": rule_drafter_matches_target,
    "trust-remote-code": rule_trust_remote_code,
    "gpu-memory": rule_gpu_memory,
    "context-length": rule_context_length,
    "unknown-flag": rule_unknown_flag,
    "duplicate-flag": rule_duplicate_flag,
    "secret-in-args": rule_secret_in_args,
}


# ---------------------------------------------------------------- local files

def read_config(path: str | None) -> dict[str, Any] | None:
    """config.json of a checkpoint directory when it exists on this machine."""
    if not path:
        return None
    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_weights_bytes(path: str | None) -> int | None:
    """Checkpoint size: model.safetensors.index.json metadata.total_size, else the shard sizes."""
    if not path or not Path(path).is_dir():
        return None
    index = Path(path) / "model.safetensors.index.json"
    try:
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if isinstance(total, int):
            return total
    except (OSError, ValueError):
        pass
    shards = list(Path(path).glob("*.safetensors"))
    return sum(s.stat().st_size for s in shards) if shards else None


def _resolve_recipe(spec: DeploymentSpec) -> tuple[Recipe | None, list[Finding]]:
    try:
        return load_recipe(spec.recipe), []
    except RecipeError as exc:
        return None, [Finding("recipe", "error", _recipe_field(e.field), e.message, e.fix)
                      for e in exc.errors]


def _recipe_field(name: str) -> str:
    return "recipe" if name in ("recipe", "") else f"recipe.{name}"


def run_preflight(spec: DeploymentSpec, *, recipe: Recipe | None = None,
                  model_config: dict[str, Any] | None = None,
                  drafter_config: dict[str, Any] | None = None,
                  gpu_memory_gb: float | None = None, read_local_configs: bool = True,
                  weights_bytes: int | None = None,
                  drafter_weights_bytes: int | None = None) -> list[Finding]:
    """Run every rule; with read_local_configs, fill in what the local checkpoints say."""
    found: list[Finding] = []
    e = spec.engine
    if read_local_configs:
        if recipe is None:
            recipe, found = _resolve_recipe(spec)
        model_config = model_config or read_config(e.model_path)
        drafter_config = drafter_config or read_config(e.speculative_draft_model_path)
        weights_bytes = weights_bytes or read_weights_bytes(e.model_path)
        drafter_weights_bytes = drafter_weights_bytes or \
            read_weights_bytes(e.speculative_draft_model_path)
    flag_list = recipe.flag_list_name if recipe else None
    ctx = Context(spec=spec, recipe=recipe, model=text_config(model_config),
                  drafter=drafter_config, gpu_memory_gb=gpu_memory_gb,
                  weights_bytes=weights_bytes, drafter_weights_bytes=drafter_weights_bytes,
                  flags=load_flags(flag_list) if flag_list else None)
    for rule in RULES.values():
        found += rule(ctx)
    return found


SELF_CHECK_MAX_BS = 8  # graph replay vs eager at a few batch sizes is enough to find a fault


def gpu_check_args(spec: DeploymentSpec, drafter_config: dict[str, Any] | None = None) -> list[str]:
    """The self-check's arguments for a deployment (appliance.selfcheck, in the container).

    Inside the container the deployment's GPUs are numbered from 0. The graph widths are
    the ones the engine will capture: budget+1 and block size for DDTREE, block size for
    DFLASH. When the block size is unknown here (it comes from the drafter's config and
    the worker cannot read it) the graph checks are skipped rather than guessed.
    """
    e = spec.engine
    ctx = Context(spec=spec, drafter=drafter_config or read_config(e.speculative_draft_model_path))
    args = ["--gpus", ",".join(str(i) for i in range(max(1, len(spec.gpus))))]
    algorithm = e.speculative_algorithm.upper()
    block = block_size(ctx)
    if algorithm in selfcheck.ALGORITHMS and (algorithm == "NONE" or block):
        args += ["--algorithm", algorithm]
        if algorithm != "NONE":
            args += ["--block-size", str(block)]
        if algorithm == "DDTREE":
            args += ["--budget", str(ddtree_budget(ctx))]
    else:
        args.append("--skip-graphs")
    max_bs = min(e.cuda_graph_max_bs or SELF_CHECK_MAX_BS, SELF_CHECK_MAX_BS)
    return args + ["--max-bs", str(max_bs)]


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
