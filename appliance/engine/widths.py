"""The CUDA-graph widths a deployment needs: tokens per request each role's graph must be
captured for, so the log follower can compare them with what the engine says it captured
(`Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=33, ...`) and
raise a finding at capture time, minutes before the first request would crash or silently
run eager.

DDTREE verifies the whole tree in one target forward: budget+1 tokens per request (the
budget defaults to block-1). Its draft runner, and DFLASH's target and draft, work on the
block. Other algorithms are not checked here (None).
"""

from __future__ import annotations

from appliance.engine.spec import EngineOptions


def needed_graph_widths(engine: EngineOptions) -> dict[str, int] | None:
    """{"target": tokens per request, "draft": ...} for DFLASH and DDTREE, else None; None
    too when CUDA graphs are off or the block size is left to the drafter's config."""
    algo = (engine.speculative_algorithm or "NONE").upper()
    if algo not in ("DFLASH", "DDTREE") or engine.disable_cuda_graph:
        return None
    block = engine.speculative_num_draft_tokens or engine.speculative_dflash_block_size
    if not block:
        return None
    if algo == "DFLASH":
        return {"target": block, "draft": block}
    budget = engine.speculative_ddtree_budget
    budget = budget if budget is not None else block - 1
    return {"target": budget + 1, "draft": block}
