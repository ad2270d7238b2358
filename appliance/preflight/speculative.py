"""Speculative decoding rules: DDTree and DFLASH settings SGLang rejects or silently degrades.

The DDTree rules that depend on the source (verify width, draft backend, page size, overlap)
are in appliance.preflight.ddtree.
"""

from __future__ import annotations

from appliance.engine.model_config import drafter_block_size, is_mla
from appliance.engine.spec import DFLASH_FAMILY, EngineOptions
from appliance.preflight.context import block_size, version_tuple
from appliance.preflight.sources import ddtree_source
from appliance.preflight.types import Context, Finding, findings

# Attention backends that take a tree (custom) mask in target verify.
TREE_BACKENDS = ("fa3", "triton", "flashinfer")
DFLASH_DEFAULT_BLOCK = 16  # SGLang's fallback when neither flag nor drafter config says
DFLASH_MAX_RUNNING_DEFAULT = 48  # _handle_dflash's cap when --max-running-requests is unset
NEEDS_DRAFT_MODEL = ("EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "DDTREE")


def rule_ddtree_budget(ctx: Context) -> list[Finding]:
    budget = ctx.engine.speculative_ddtree_budget
    if ctx.algorithm != "DDTREE":
        if budget is None:
            return []
        return findings("ddtree-budget", "warning", "engine.speculative_ddtree_budget",
                        f"a DDTree budget is set but the algorithm is {ctx.algorithm}; "
                        "SGLang ignores it", "remove it or set speculative_algorithm: DDTREE")
    if budget is not None and budget < 1:
        return findings("ddtree-budget", "error", "engine.speculative_ddtree_budget",
                        f"the tree budget must be at least 1, got {budget}",
                        "set speculative_ddtree_budget to 1 or more (e.g. 32)")
    block = block_size(ctx)
    if budget is None and block:
        return findings("ddtree-budget", "info", "engine.speculative_ddtree_budget",
                        f"no budget set: DDTree uses block size - 1 = {block - 1} tree nodes",
                        "set speculative_ddtree_budget to verify a wider tree (e.g. 32)")
    return []


def rule_tree_attention_backend(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DDTREE":
        return []
    backend, mla = ctx.engine.attention_backend, is_mla(ctx.model)
    fld = "engine.attention_backend"
    if backend is None:
        return findings("tree-attention-backend", "warning", fld,
                        "no attention backend set: SGLang picks one per GPU and model, and not "
                        "every backend takes DDTree's tree mask",
                        "set attention_backend: fa3 (or triton)")
    if backend not in TREE_BACKENDS:
        return findings("tree-attention-backend", "error", fld,
                        f"attention backend {backend!r} cannot verify a draft tree (no tree mask)",
                        "use fa3 or triton (flashinfer only for non-MLA models)")
    if backend == "flashinfer" and mla:
        return findings("tree-attention-backend", "error", fld,
                        "FlashInfer's MLA backend supports only topk=1 (chain) speculative "
                        "decoding; this model uses MLA, so DDTree's tree verify cannot run",
                        "use attention_backend: fa3 (Hopper) or triton")
    if backend == "flashinfer" and mla is None:
        return findings("tree-attention-backend", "warning", fld,
                        "flashinfer takes a tree mask only on non-MLA models and the model "
                        "config could not be read", "use fa3 or triton for MLA models")
    return []


def rule_dflash_dp_attention(ctx: Context) -> list[Finding]:
    e = ctx.engine
    if ctx.algorithm not in DFLASH_FAMILY or not e.enable_dp_attention:
        return []
    fld = "engine.enable_dp_attention"
    if ctx.algorithm == "DDTREE":
        return findings("dflash-dp-attention", "error", fld,
                        "DDTree's worker extends this source's DFlashWorker, which does not "
                        "support dp attention", "remove enable_dp_attention")
    version = version_tuple(ctx.recipe.sglang_version if ctx.recipe else None)
    if version is not None and version < (0, 5, 23):
        return findings("dflash-dp-attention", "error", fld,
                        "DFLASH does not support dp attention before SGLang 0.5.23",
                        "remove enable_dp_attention, or use SGLang 0.5.23 with enable_dp_lm_head")
    if not e.enable_dp_lm_head:
        return findings("dflash-dp-attention", "error", fld,
                        "DFLASH with dp attention requires --enable-dp-lm-head (SGLang raises "
                        "at start-up)",
                        "set enable_dp_lm_head: true, or remove enable_dp_attention")
    return []


def rule_dflash_pipeline_parallel(ctx: Context) -> list[Finding]:
    if ctx.algorithm not in DFLASH_FAMILY or ctx.engine.pp_size == 1:
        return []
    return findings("dflash-pipeline-parallel", "error", "engine.pp_size",
                    f"{ctx.algorithm} speculative decoding only supports pp_size == 1, got "
                    f"{ctx.engine.pp_size}", "set pp_size: 1 and use tp_size for the GPUs")


def _flag_disagreement(e: EngineOptions) -> list[Finding]:
    nd, bs = e.speculative_num_draft_tokens, e.speculative_dflash_block_size
    if nd is None or bs is None or nd == bs:
        return []
    return findings("block-size-agreement", "error", "engine.speculative_dflash_block_size",
                    f"speculative_num_draft_tokens={nd} and speculative_dflash_block_size={bs} "
                    "differ; for DFLASH they must match", "set only one of them")


def _drafter_disagreement(ctx: Context, block: int, trained: int) -> list[Finding]:
    fld = "engine.speculative_num_draft_tokens"
    if block > trained:
        return findings("block-size-agreement", "error", fld,
                        f"block size {block} is larger than the drafter's trained block size "
                        f"{trained} (its config.json)",
                        f"set speculative_num_draft_tokens: {trained}")
    return findings("block-size-agreement", "warning", fld,
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
    source = ddtree_source(ctx.recipe)
    if block is None and ctx.algorithm == "DDTREE" and not (source and source.infers_block_size):
        found += findings("block-size-agreement", "error", "engine.speculative_num_draft_tokens",
                          "DDTREE needs an explicit block size: this source does not run "
                          "DFLASH's argument handling that infers it from the drafter",
                          f"set speculative_num_draft_tokens: {trained or 8}")
    elif block is None:
        found += findings("block-size-agreement", "info", "engine.speculative_num_draft_tokens",
                          f"block size comes from the drafter config ({trained}) or defaults to "
                          f"{DFLASH_DEFAULT_BLOCK}", "set speculative_num_draft_tokens to be sure")
    return found


def rule_speculative_draft_model(ctx: Context) -> list[Finding]:
    if ctx.algorithm not in NEEDS_DRAFT_MODEL or ctx.engine.speculative_draft_model_path:
        return []
    return findings("speculative-draft-model", "error", "engine.speculative_draft_model_path",
                    f"{ctx.algorithm} speculative decoding requires a draft model path",
                    "set speculative_draft_model_path to the drafter's directory")


def rule_dflash_max_running_requests(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DFLASH" or ctx.engine.max_running_requests is not None:
        return []
    return findings("dflash-max-running-requests", "info", "engine.max_running_requests",
                    f"DFLASH caps max running requests at {DFLASH_MAX_RUNNING_DEFAULT} when unset",
                    "set max_running_requests to serve more concurrent requests")


def rule_cuda_graph_disabled(ctx: Context) -> list[Finding]:
    if ctx.algorithm == "NONE" or not ctx.engine.disable_cuda_graph:
        return []
    return findings("cuda-graph-disabled", "warning", "engine.disable_cuda_graph",
                    "CUDA graphs are off: every draft and verify step runs eager, which loses "
                    "most of the speculative speed-up", "remove disable_cuda_graph")


def rule_algorithm_in_source(ctx: Context) -> list[Finding]:
    if ctx.flags is None or ctx.algorithm not in DFLASH_FAMILY:
        return []
    marker = {"DDTREE": "--speculative-ddtree-budget", "DFLASH": "--speculative-dflash-block-size"}
    if marker[ctx.algorithm] in ctx.flags:
        return []
    source = ctx.recipe.sglang_version or ctx.recipe.name if ctx.recipe else "this source"
    return findings("algorithm-in-source", "error", "engine.speculative_algorithm",
                    f"SGLang {source} has no {ctx.algorithm} speculative decoding",
                    "use the kimi-k2.6-ddtree recipe" if ctx.algorithm == "DDTREE"
                    else "use SGLang 0.5.11 or newer")
