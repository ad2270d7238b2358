"""DDTree settings that make 433c58ed7's verify crash at warm-up or quietly leave its CUDA
graph (docs/engine-sources.md, "Rules the recipe and preflight must keep"). Paths are under
python/sglang/srt/ of that source.

- The target's verify graph is captured at one width, budget+1; a verify of any other width
  runs eagerly without a word (model_executor/runner/decode_cuda_graph_runner.py:517-526).
  --is-ddtree-prune (with its default or given --speculative-ddtree-cuda-graph-buckets)
  verifies pruned, narrower trees (speculative/ddtree_worker_v2.py:509-515).
- More running requests than the largest captured batch also verify eagerly.
- --use-tree-attention needs a FlashAttention target (ddtree_worker_v2.py:523-527).
- fa3 verifies from visibility metadata; the FlashInfer autotune warm-up (a flashinfer_* MoE
  runner or the flashinfer_cutlass FP8 GEMM: model_executor/runner/flashinfer_autotune.py:
  34-104) feeds a DDTree dummy without it and raises "DDTREE one-pass FlashAttention verify
  requires visibility metadata." (layers/attention/flashattention_backend.py:433-436).
"""

from __future__ import annotations

from appliance.engine.flags import flags_in_argv
from appliance.preflight.sources import FLASH_ATTENTION, DDTreeSource, ddtree_source
from appliance.preflight.types import Context, Finding, findings

ONE_WIDTH_SOURCES = ("433c58ed7",)  # one target verify graph width, eager otherwise
NARROWING_FLAGS = ("--is-ddtree-prune", "--speculative-ddtree-cuda-graph-buckets")
AUTOTUNE_FLAGS = {"--moe-runner-backend": "flashinfer", "--fp8-gemm-backend": "flashinfer_cutlass"}
DEFAULT_MAX_RUNNING = 48  # _handle_dflash's cap, also DDTree's (arg_groups/speculative_hook.py)


def _source(ctx: Context) -> DDTreeSource | None:
    if ctx.algorithm != "DDTREE":
        return None
    source = ddtree_source(ctx.recipe)
    return source if source is not None and source.short in ONE_WIDTH_SOURCES else None


def _extra(ctx: Context) -> dict[str, tuple[int, str | None]]:
    """Flags in extra_args: flag -> (index, the value after it, if any)."""
    args = list(ctx.spec.extra_args)
    found: dict[str, tuple[int, str | None]] = {}
    for index, flag in flags_in_argv(args):
        inline = args[index].partition("=")[2]
        value = inline or (args[index + 1] if index + 1 < len(args) and
                           not args[index + 1].startswith("--") else None)
        found.setdefault(flag, (index, value))
    return found


def rule_ddtree_graph_width_only(ctx: Context) -> list[Finding]:
    source = _source(ctx)
    if source is None or ctx.engine.disable_cuda_graph:
        return []
    found: list[Finding] = []
    extra = _extra(ctx)
    for flag in NARROWING_FLAGS:
        if flag in extra:
            found += findings(
                "ddtree-graph-width", "warning", f"extra_args[{extra[flag][0]}]",
                f"{flag} verifies trees narrower than budget+1, but {source.short} captures the "
                "target's verify graph at budget+1 only: every narrower verify runs eagerly, "
                "and nothing in the log says so except `cuda graph: False`",
                f"remove {flag}")
    found += _running_above_graphs(ctx)
    return found


def _running_above_graphs(ctx: Context) -> list[Finding]:
    engine = ctx.engine
    running = engine.max_running_requests or DEFAULT_MAX_RUNNING
    if engine.cuda_graph_max_bs is None or running <= engine.cuda_graph_max_bs:
        return []
    return findings(
        "ddtree-graph-width", "warning", "engine.max_running_requests",
        f"up to {running} running requests but verify graphs only up to batch "
        f"{engine.cuda_graph_max_bs}: larger batches verify eagerly",
        f"set max_running_requests to at most {engine.cuda_graph_max_bs}, or raise "
        f"cuda_graph_max_bs to {running}")


def rule_ddtree_fa_verify_inputs(ctx: Context) -> list[Finding]:
    source = _source(ctx)
    if source is None:
        return []
    extra, backend = _extra(ctx), ctx.engine.attention_backend
    found: list[Finding] = []
    if "--use-tree-attention" in extra and backend not in FLASH_ATTENTION:
        found += findings(
            "ddtree-fa-verify", "error", f"extra_args[{extra['--use-tree-attention'][0]}]",
            f"--use-tree-attention needs a FlashAttention target; with {backend or 'the default'}"
            " backend the first verify raises RuntimeError: --use-tree-attention requires an "
            "FA3/FA4 target backend", "remove --use-tree-attention, or use attention_backend: fa3")
    if backend not in FLASH_ATTENTION:
        return found
    for flag, prefix in AUTOTUNE_FLAGS.items():
        index, value = extra.get(flag, (None, None))
        if index is not None and value and value.startswith(prefix):
            found += findings(
                "ddtree-fa-verify", "error", f"extra_args[{index}]",
                f"{flag} {value} turns on FlashInfer's autotune warm-up, which feeds fa3 a "
                "DDTree dummy without visibility metadata: start-up fails after the full model "
                "load with ValueError: DDTREE one-pass FlashAttention verify requires visibility "
                "metadata.", f"drop {flag} {value}, or use attention_backend: triton")
    return found
