"""The Prometheus /metrics text, with SGLang's metric names."""

from __future__ import annotations

from sglang.test_engine import engine
from sglang.test_engine.engine import MAX_TOKENS_POOL, STATE, Histogram
from sglang.test_engine.loglines import cuda_graph_on
from sglang.test_engine.settings import HIST_BUCKETS


def metrics_text() -> str:
    labels = f'model_name="{engine.CFG.model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    gauges = {
        "num_running_reqs": ("The number of running requests.", STATE.running),
        "num_queue_reqs": ("The number of requests in the waiting queue.", STATE.queued),
        "num_used_tokens": ("The number of used tokens.", STATE.tokens_in_use),
        "token_usage": ("The token usage.", STATE.tokens_in_use / MAX_TOKENS_POOL),
        "gen_throughput": ("The generation throughput (token/s).", STATE.last_gen_throughput),
        "cache_hit_rate": ("The prefix cache hit rate.", STATE.cache_hit_rate),
        "spec_accept_length": ("The average acceptance length of speculative decoding.",
                               STATE.avg_accept if engine.CFG.speculative else 0.0),
        "spec_accept_rate": ("The average acceptance rate of speculative decoding.",
                             (STATE.avg_accept - 1) / max(engine.CFG.block - 1, 1)
                             if engine.CFG.speculative and STATE.verify_steps else 0.0),
        "is_cuda_graph": ("Whether the batch is using CUDA graph.",
                          1.0 if cuda_graph_on(engine.CFG) else 0.0),
        "weight_load_duration_seconds": ("Time spent loading model weights.",
                                         STATE.weight_load_s),
    }
    out: list[str] = []
    for name, (help_text, value) in gauges.items():
        out += [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} gauge",
                f"sglang:{name}{{{labels}}} {float(value)}"]
    for name, help_text, value in (
        ("prompt_tokens", "Number of prefill tokens processed.", STATE.prompt_tokens),
        ("generation_tokens", "Number of generation tokens processed.",
         STATE.generation_tokens),
        ("num_requests", "The number of processed requests.", STATE.num_requests),
    ):
        out += [f"# HELP sglang:{name}_total {help_text}", f"# TYPE sglang:{name}_total counter",
                f"sglang:{name}_total{{{labels}}} {float(value)}"]
    for name, help_text, hist in (
        ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         STATE.ttft),
        ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
         STATE.itl),
        ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
         STATE.e2e),
    ):
        out += histogram_lines(name, help_text, hist, labels)
    return "\n".join(out + cached_tokens_lines()) + "\n"


def cached_tokens_lines() -> list[str]:
    """433c58ed7's counter by cache source, its labels as recorded (no ranks); like a
    Prometheus labelled counter it has no sample before its first increment."""
    out = ["# HELP sglang:cached_tokens_total Number of cached prompt tokens by source "
           "(device/host/storage).", "# TYPE sglang:cached_tokens_total counter"]
    if STATE.cached_tokens:
        out.append(f'sglang:cached_tokens_total{{cache_source="device",engine_type="unified",'
                   f'model_name="{engine.CFG.model_name}"}} {float(STATE.cached_tokens)}')
    return out


def histogram_lines(name: str, help_text: str, hist: Histogram, labels: str) -> list[str]:
    out = [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} histogram"]
    for bound, count in zip(HIST_BUCKETS, hist.counts, strict=True):
        out.append(f'sglang:{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
    out.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {float(hist.n)}')
    out.append(f"sglang:{name}_sum{{{labels}}} {hist.total}")
    out.append(f"sglang:{name}_count{{{labels}}} {float(hist.n)}")
    return out
