"""DDTree rules that depend on the SGLang source: verify graph width, the draft's attention
backend, page size and overlap scheduling. What each source does is in
appliance.preflight.sources; a source it does not know gets no source-specific finding
beyond a warning where the known sources disagree.
"""

from __future__ import annotations

from appliance.preflight.context import block_size, ddtree_budget
from appliance.preflight.sources import FLASH_ATTENTION, DDTreeSource, ddtree_source
from appliance.preflight.types import Context, Finding, Severity, findings

VERIFY_WIDTH_PATCH = "ddtree-verify-graph-width"
DRAFT_FIX = "set speculative_draft_attention_backend: flashinfer (or triton)"


def _source(ctx: Context) -> DDTreeSource | None:
    return ddtree_source(ctx.recipe) if ctx.algorithm == "DDTREE" else None


def _unknown_commit(ctx: Context) -> bool:
    """A pinned commit the appliance has no facts for (releases have no DDTREE at all)."""
    return ctx.recipe is not None and not ctx.recipe.sglang.pip and \
        ddtree_source(ctx.recipe) is None


def _width_error(ctx: Context, block: int, budget: int) -> list[Finding]:
    name = ctx.recipe.name if ctx.recipe else "this recipe"
    if ctx.engine.attention_backend in FLASH_ATTENTION:
        # fa3 reads the tree (topk>1) verify metadata it only allocates for topk > 1.
        failure = ("the target's verify graph capture fails after the full model load with "
                   "AttributeError: 'FlashAttentionBackend' object has no attribute "
                   "'target_verify_metadata_topk_normal'")
    else:
        failure = (f"replay fails with 'The size of tensor a ({block}) must match the size of "
                   f"tensor b ({budget + 1})' after the full model load (newer SGLang silently "
                   "falls back to eager verify instead)")
    return findings(
        "ddtree-verify-width", "error", "recipe",
        f"recipe {name!r} lacks the {VERIFY_WIDTH_PATCH} patch: this source captures the target "
        f"verify CUDA graph at the block size ({block} tokens per request) but DDTree verifies "
        f"budget+1 = {budget + 1}; {failure}",
        f"use a recipe with the {VERIFY_WIDTH_PATCH} patch, a source that captures budget+1 "
        "itself (398fc2c72, 433c58ed7), or set engine.disable_cuda_graph: true and accept "
        "eager verify")


def rule_ddtree_verify_width(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DDTREE" or ctx.engine.disable_cuda_graph or ctx.recipe is None:
        return []
    block, budget = block_size(ctx), ddtree_budget(ctx)
    if block is None or budget is None:
        return []
    source = ddtree_source(ctx.recipe)
    widths = f"target verify CUDA graph width {budget + 1} (budget+1), draft graph width " \
        f"{block} (block size)"
    if source is not None and not source.needs_width_patch:
        return findings("ddtree-verify-width", "info", "recipe",
                        f"{widths}: SGLang {source.short} captures them itself",
                        "nothing to do")
    if VERIFY_WIDTH_PATCH in ctx.recipe.patches:
        return findings("ddtree-verify-width", "info", "recipe",
                        f"{widths}, via the {VERIFY_WIDTH_PATCH} patch", "nothing to do")
    if _unknown_commit(ctx):
        return findings("ddtree-verify-width", "warning", "recipe",
                        f"SGLang source of recipe {ctx.recipe.name!r} is not one the appliance "
                        f"knows: whether it captures the target verify graph at budget+1 = "
                        f"{budget + 1} is unchecked (101cd5bd0 captures the block size)",
                        "watch the capture log: the target's verify width must be budget+1")
    return _width_error(ctx, block, budget)


def rule_ddtree_draft_attention_backend(ctx: Context) -> list[Finding]:
    source = _source(ctx)
    if source is None or not source.draft_fa_cascade:
        return []
    e, fld = ctx.engine, "engine.speculative_draft_attention_backend"
    draft = e.speculative_draft_attention_backend or e.attention_backend
    if draft is None:
        return findings("ddtree-draft-attention-backend", "warning", fld,
                        f"no draft attention backend set: on SGLang {source.short} the draft "
                        "takes the target's backend, which SGLang makes fa3 on Hopper, and an "
                        "fa3 draft crashes at capture", DRAFT_FIX)
    if draft not in FLASH_ATTENTION:
        return []
    inherited = "" if e.speculative_draft_attention_backend else \
        " (taken from attention_backend, as this source's DFlashWorker does)"
    return findings(
        "ddtree-draft-attention-backend", "error", fld,
        f"the draft runs on {draft}{inherited}: SGLang {source.short}'s FlashAttention turns "
        "cascade attention on whenever spec_algorithm.is_ddtree(), which is true for the draft "
        "runner too, so capturing the draft graph fails right after the target's with "
        "AttributeError: 'NoneType' object has no attribute 'page_table' (eager, the same "
        "branch reads the draft's missing custom_mask)",
        f"{DRAFT_FIX}; the target keeps {e.attention_backend or 'its backend'}")


def _page_size_message(ctx: Context, source: DDTreeSource, page: int) -> str | None:
    backend = ctx.engine.attention_backend
    if not source.paged_verify:
        return (f"SGLang {source.short} takes the verify KV slots with allocator.alloc("
                f"bs * (budget+1)), which on a paged pool hands out whole pages only: with "
                f"page_size {page} the first verify fails or writes KV to the wrong slots")
    if source.fa_page_size_one and backend in FLASH_ATTENTION:
        return (f"SGLang {source.short}'s FlashAttention tree verify raises 'DDTREE one-pass "
                "FlashAttention verify currently requires page_size=1.' while capturing the "
                "target verify graph, after the full model load")
    return None


def rule_ddtree_page_size(ctx: Context) -> list[Finding]:
    source, page = _source(ctx), ctx.engine.page_size
    if source is None or page is None or page == 1:
        return []  # unset means SGLang's default, 1
    message = _page_size_message(ctx, source, page)
    if message is not None:
        keep = "" if not source.paged_verify else \
            f", or keep page_size {page} with attention_backend: triton"
        return findings("ddtree-page-size", "error", "engine.page_size", message,
                        f"set page_size: 1 (or leave it unset){keep}")
    if source.fa_page_size_one and ctx.engine.attention_backend is None:
        return findings("ddtree-page-size", "warning", "engine.page_size",
                        f"page_size {page} with no attention backend set: on Hopper SGLang "
                        f"picks fa3, whose tree verify on {source.short} needs page_size 1",
                        "set attention_backend: triton, or page_size: 1")
    return []


def rule_ddtree_overlap_schedule(ctx: Context) -> list[Finding]:
    if ctx.algorithm != "DDTREE":
        return []
    source, off = ddtree_source(ctx.recipe), ctx.engine.disable_overlap_schedule
    fld = "engine.disable_overlap_schedule"
    if source is not None and source.overlap == "supported":
        return [] if not off else findings(
            "ddtree-overlap-schedule", "info", fld,
            f"SGLang {source.short} runs DDTree with the overlap (spec v2) scheduler too; "
            "disable_overlap_schedule: true makes each step synchronous",
            "remove disable_overlap_schedule unless synchronous steps are wanted")
    if off or (source is None and not _unknown_commit(ctx)):
        return []
    if source is not None and source.overlap == "turned-off":
        return findings("ddtree-overlap-schedule", "info", fld,
                        f"SGLang {source.short} turns the overlap scheduler off for DDTREE",
                        "nothing to do")
    severity: Severity = "error" if source is not None else "warning"
    which = f"SGLang {source.short}" if source else "101cd5bd0 (this source is unknown)"
    return findings("ddtree-overlap-schedule", severity, fld,
                    f"{which}: DDTreeWorker raises 'DDTREE does not support overlap scheduling "
                    "(spec v2)' and argument handling does not turn the overlap scheduler off "
                    "for DDTREE", "set disable_overlap_schedule: true")
