"""Why speculative decoding runs without CUDA graphs (decode lines saying `cuda graph:
False`), by what the evidence shows; never a recipe change when the recipe is not the cause.

- the spec (or the engine's server_args) turned graphs off: a note with its speed cost (the
  recordings ddtree_nograph against ddtree_triton, tests/fixtures/real-engine/433c58ed7:
  p50 time per output token at concurrency 1, 13.58 ms against 4.65 ms; the eager run shared
  its H200 with other recordings, so the figure is an upper bound on the cost);
- the batch is above the largest captured batch size (cuda_graph_max_bs): eager by design;
- the target's verify graph was captured at another width than the tree needs: the recipe
  (its source captures at budget+1) is the fix;
- otherwise: what was captured and what is needed, and where to look, no recipe change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.logs.cause import Cause, Diagnosis
from appliance.logs.context import ParseContext

RECIPE_FIX = ("Deploy with the kimi-k2.6-ddtree recipe (its source captures the target verify "
              "graph at budget+1), or a recipe with the patch ddtree-verify-graph-width; the "
              "CUDA graph figure on this page then says True.")

EAGER_CAUSES: tuple[Cause, ...] = (
    Cause(
        "cuda-graphs-disabled",
        "CUDA graphs are off by the spec (engine.disable_cuda_graph): every decode pass runs "
        "eagerly, as asked.",
        "Nothing is broken. The speed cost: each decode pass launches its kernels one by one "
        "instead of replaying a captured graph, most felt at small batches (the real engine, "
        "DDTREE on one H200: 13.58 ms per output token at one request eagerly against 4.65 ms "
        "on graphs); to decode on graphs, set engine.disable_cuda_graph: false in the spec "
        "(or drop --disable-cuda-graph from Extra engine arguments) and redeploy.",
        30,
        severity="info",
    ),
    Cause(
        "eager-above-max-bs",
        "A decode batch is larger than the largest batch size SGLang captured a CUDA graph "
        "for (cuda_graph_max_bs), so those passes run eagerly, by design.",
        "If batches this large are the usual load, raise --cuda-graph-max-bs in Extra engine "
        "arguments (spec key engine.cuda_graph_max_bs) to the batch size shown, memory "
        "permitting; or cap concurrent requests there with --max-running-requests (spec key "
        "engine.max_running_requests).",
        30,
        severity="info",
    ),
)


def needed_target_width(ctx: ParseContext) -> int | None:
    """The tokens per request the target's verify graph needs: the spec's, else what the
    engine's server_args say (DDTREE budget+1, DFLASH the block)."""
    if ctx.needed_widths and ctx.needed_widths.get("target"):
        return int(ctx.needed_widths["target"])
    facts = ctx.facts
    algorithm = str(facts.get("speculative_algorithm") or "").upper()
    if algorithm == "DDTREE" and isinstance(facts.get("speculative_ddtree_budget"), int):
        return int(facts["speculative_ddtree_budget"]) + 1
    if algorithm == "DFLASH" and isinstance(facts.get("speculative_num_draft_tokens"), int):
        return int(facts["speculative_num_draft_tokens"])
    return None


def eager_decode(stats: Mapping[str, Any], ctx: ParseContext | None,
                 silent: Cause, disabled: Cause, above: Cause) -> Diagnosis:
    """The cause a speculative decode line without CUDA graphs shows."""
    running = stats.get("running_req")
    max_bs = max(ctx.capture_bs) if ctx is not None and ctx.capture_bs else None
    if ctx is not None and max_bs is None and isinstance(ctx.facts.get("cuda_graph_max_bs"), int):
        max_bs = int(ctx.facts["cuda_graph_max_bs"])
    evidence: dict[str, Any] = {"running_req": running, "accept_len": stats.get("accept_len"),
                                "captured_width": ctx.verify_width if ctx else None,
                                "max_captured_bs": max_bs}
    if ctx is not None and ctx.facts.get("disable_cuda_graph"):
        return disabled.diagnosis(**evidence, gen_throughput=stats.get("gen_throughput"))
    if max_bs is not None and running is not None and running > max_bs:
        return above.diagnosis(**evidence)
    needed = needed_target_width(ctx) if ctx is not None else None
    captured = evidence["captured_width"]
    evidence["needed_width"] = needed
    if captured is not None and needed is not None and captured != needed:
        return Diagnosis(silent.id, f"Speculative decoding runs without CUDA graphs (decode "
                         f"lines say cuda graph: False): the target's verify graph was "
                         f"captured {captured} tokens wide and the tree needs {needed}, so "
                         "SGLang falls back to eager.", RECIPE_FIX, evidence)
    if captured is None:
        what = "no target verify graph was captured (no capture line in the log)"
    else:
        what = (f"the target's verify graph was captured {captured} tokens wide"
                + (", as the tree needs" if needed == captured else ""))
    return Diagnosis(silent.id, "Speculative decoding runs without CUDA graphs (decode lines "
                     f"say cuda graph: False) and the spec does not turn them off; {what}.",
                     "Read the capture lines of the log (each role's width and batch sizes) "
                     "and the lines before the first eager decode line: a capture that failed "
                     "or was skipped (too little memory left, an unsupported backend) says so "
                     "there; the spec and recipe are not shown to be the cause.", evidence)
