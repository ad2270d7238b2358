"""The target's CUDA-graph memory, estimated before the load from real captures.

With triton, the graph pool of the target's verify (or decode) graph grows with the tokens
one graph step feeds, T = largest captured batch size x tokens per request: the kv-index
buffer holds 8 bytes per token of context for each of them (the 3.09 GiB allocation that
ran out of memory in the recorded capture_oom run: 48 x 33 x 262,144 x 8 bytes), and the
activations and attention workspace about 4.6 MiB more per token. Fitted on six captures of
the real engine (tests/fixtures/real-engine, 433c58ed7 on an H200): DDTREE width 33 at batch
limits 48 and 16 and contexts 262,144 and 32,768, DFLASH width 8 at 48 and 16, the plain
decode graph (width 1, 256); every estimate is within 8 % of the capture's printed memory.
The activation term is the tiny Kimi-architecture model's (hidden 256): a model with wider
layers needs more, so for Kimi K2.6 the figure is a floor. fa3 is not calibrated here: its
graphs read the page table instead (2.39 GB against triton's 10.00 GB at width 33).
"""

from __future__ import annotations

from appliance.engine.spec import EngineOptions
from appliance.engine.widths import needed_graph_widths
from appliance.preflight.types import Context, Finding

GIB = 1024**3
KV_INDEX_BYTES = 8  # per token of context, per verify token (int64)
ACTIVATION_BYTES = int(4.6 * 1024**2)  # per verify token, fitted on the recordings
CALIBRATED_ERROR = 0.08  # the largest relative error against the six real captures
SPECULATIVE_MAX_BS = 48  # SGLang resets max running requests to 48 for speculative decoding
PLAIN_MAX_BS = 256  # the plain decode graph's largest batch on an H200 (recorded)


def graph_batch_limit(engine: EngineOptions) -> int:
    if engine.cuda_graph_max_bs:
        return engine.cuda_graph_max_bs
    if engine.speculative_algorithm == "NONE":
        return PLAIN_MAX_BS
    return min(engine.max_running_requests or SPECULATIVE_MAX_BS, SPECULATIVE_MAX_BS)


def target_graph_gib(*, max_bs: int, width: int, context_len: int) -> float:
    tokens = max_bs * width
    return tokens * (KV_INDEX_BYTES * context_len + ACTIVATION_BYTES) / GIB


def rule_graph_memory(ctx: Context) -> list[Finding]:
    e = ctx.engine
    context_len = e.context_length or (ctx.model or {}).get("max_position_embeddings")
    if e.disable_cuda_graph or e.attention_backend != "triton" or not isinstance(context_len, int):
        return []
    width = (needed_graph_widths(e) or {}).get("target", 1)
    max_bs = graph_batch_limit(e)
    gib = target_graph_gib(max_bs=max_bs, width=width, context_len=context_len)
    what = (f"the target's CUDA graph takes about {gib:.1f} GB per GPU (triton: {max_bs} "
            f"requests x {width} tokens x {context_len:,} context; calibrated on real "
            f"captures, within {CALIBRATED_ERROR:.0%}, a floor for wider models)")
    spare = None
    if e.mem_fraction_static is not None and ctx.gpu_memory_gb is not None:
        spare = ctx.gpu_memory_gb * (1 - e.mem_fraction_static)
    if spare is not None and gib > spare:
        return [Finding("graph-memory", "warning", "engine.cuda_graph_max_bs",
                        f"{what}, more than the {spare:.1f} GB mem_fraction_static "
                        f"{e.mem_fraction_static} leaves: the capture runs out of memory after "
                        "the whole load",
                        f"lower cuda_graph_max_bs (to {max(1, max_bs // 2)}), context_length, "
                        "or mem_fraction_static")]
    return [Finding("graph-memory", "info", "engine.cuda_graph_max_bs", what, "")]
