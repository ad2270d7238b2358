"""Typed snapshot of SGLang's Prometheus /metrics text.

Metric names and labels are those of sglang 0.5.23
srt/observability/metrics_collector.py: scheduler gauges carry model_name,
engine_type, tp_rank, pp_rank, moe_ep_rank (and dp_rank with DP attention);
tokenizer counters and histograms carry model_name and is_streaming.

Aggregation: every TP rank of one DP group reports the same scheduler state,
so one sample per DP group is kept (tp_rank 0 when present); counts and
throughputs are summed over DP groups, ratios averaged, and the CUDA-graph
flag is true only when every group runs graphs. Histograms are merged bucket
by bucket and their quantiles estimated as Prometheus' histogram_quantile does.

The pinned DDTree source (433c58ed7, recorded in tests/fixtures/real-engine/) reports
more than 0.5.23 and some of it differently; the recording wins:
- `sglang:cuda_graph_passes_total{mode=decode_cuda_graph|decode_none|prefill_...}` counts
  forward passes by whether they replayed a CUDA graph: the truthful graph signal (the
  series takes its rate). `sglang:is_cuda_graph` is declared there but nothing assigns it
  (observability/metrics_collector.py:139): it read 0.0 on every scrape of a graphed run.
- `sglang:spec_verify_calls_total` counts verify steps of finished requests (with
  generation_tokens_total and num_requests_total, at each request's end): accept length
  over a window is (generated tokens - requests) / verify calls, each request's first
  token coming from its prefill, which is the server's own avg_spec_accept_length.
- `sglang:token_usage` is rounded to 2 places (pool_stats_observer.py:124), so it reads
  0.0 with 21,426 of 23,473,287 tokens in use; `full_token_usage` (with `swa_token_usage`
  and `mamba_usage`, whose maximum SGLang rounds) is the unrounded figure.
- `sglang:realtime_tokens_total{mode=decode|prefill_compute|prefill_cache}` counts tokens as
  each batch runs, while prompt_ and generation_tokens_total count a request's tokens
  when it finishes (a request decoding across a scrape shows there only at its end).
- no `weight_load_duration_seconds`; `engine_load_weights_time` read 0.0 there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

PREFIX = "sglang:"
SUMMED_GAUGES = {
    "num_running_reqs": "num_running_reqs",
    "num_queue_reqs": "num_queue_reqs",
    "gen_throughput": "gen_throughput",
}
AVERAGED_GAUGES = {
    "token_usage": "token_usage",
    "cache_hit_rate": "cache_hit_rate",
    "spec_accept_length": "spec_accept_length",
    "spec_accept_rate": "spec_accept_rate",
    "full_token_usage": "full_token_usage",
    "swa_token_usage": "swa_token_usage",
    "mamba_usage": "mamba_usage",
}
COUNTERS = {
    "prompt_tokens_total": "prompt_tokens_total",
    "generation_tokens_total": "generation_tokens_total",
    "spec_verify_calls_total": "spec_verify_calls_total",
    "num_requests_total": "num_requests_total",
}
# sglang:cuda_graph_passes_total's decode modes (metrics_collector.py
# increment_decode_cuda_graph_pass); prefill passes run eagerly unless piecewise graphs are
# on, so they say nothing about the decode/verify graphs.
REALTIME_MODES = {
    "decode": "realtime_decode_tokens_total",
    "prefill_compute": "realtime_prefill_tokens_total",
    "prefill_cache": "realtime_prefill_tokens_total",
}
GRAPH_PASS_MODES = {
    "decode_cuda_graph": "decode_graph_passes_total",
    "decode_none": "decode_eager_passes_total",
}
HISTOGRAMS = {
    "time_to_first_token_seconds": "ttft",
    "inter_token_latency_seconds": "itl",
    "e2e_request_latency_seconds": "e2e",
}
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


@dataclass
class HistogramSummary:
    count: float = 0.0
    sum: float = 0.0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    # The merged cumulative buckets (upper bound, count), +Inf last: a window's quantiles
    # come from two snapshots' difference (window_summary). Not part of to_dict().
    buckets: list[tuple[float, float]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "mean": self.mean,
                "p50": self.p50, "p90": self.p90, "p99": self.p99}


@dataclass
class MetricsSnapshot:
    num_running_reqs: float | None = None
    num_queue_reqs: float | None = None
    gen_throughput: float | None = None
    token_usage: float | None = None
    full_token_usage: float | None = None
    swa_token_usage: float | None = None
    mamba_usage: float | None = None
    cache_hit_rate: float | None = None
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    is_cuda_graph: bool | None = None
    weight_load_duration_seconds: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    spec_verify_calls_total: float | None = None
    num_requests_total: float | None = None
    realtime_decode_tokens_total: float | None = None
    realtime_prefill_tokens_total: float | None = None
    decode_graph_passes_total: float | None = None
    decode_eager_passes_total: float | None = None
    ttft: HistogramSummary = field(default_factory=HistogramSummary)
    itl: HistogramSummary = field(default_factory=HistogramSummary)
    e2e: HistogramSummary = field(default_factory=HistogramSummary)
    model_names: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in HISTOGRAMS.values():
            data[name] = getattr(self, name).to_dict()
        return data

    @property
    def kv_usage(self) -> float | None:
        """KV pool usage 0-1: SGLang's token_usage before its rounding to 2 places, where
        the engine reports the pools' own figures; token_usage otherwise."""
        pools = [u for u in (self.full_token_usage, self.swa_token_usage, self.mamba_usage)
                 if u is not None]
        return max(pools) if self.full_token_usage is not None else self.token_usage


def _leader(samples: Iterable[Sample]) -> list[Sample]:
    """One sample per label set, ignoring TP ranks other than 0 (they repeat rank 0)."""
    kept = [s for s in samples if s.labels.get("tp_rank", "0") == "0"]
    return kept or list(samples)


def _group_by_dp(samples: list[Sample]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        if not math.isnan(sample.value):
            groups[sample.labels.get("dp_rank", "")].append(sample.value)
    return groups


def _summed(samples: list[Sample]) -> float | None:
    groups = _group_by_dp(_leader(samples))
    return sum(values[0] for values in groups.values()) if groups else None


def _averaged(samples: list[Sample]) -> float | None:
    groups = _group_by_dp(_leader(samples))
    if not groups:
        return None
    return sum(values[0] for values in groups.values()) / len(groups)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' estimate: linear interpolation inside the bucket holding rank q*count.

    `buckets` are (upper bound, cumulative count) sorted by bound, ending with +Inf.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # the top bucket has no upper edge to interpolate to
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def _histogram(samples: list[Sample], name: str) -> HistogramSummary:
    by_le: dict[float, float] = defaultdict(float)
    total = count = 0.0
    for sample in _leader(samples):
        if sample.name == f"{name}_bucket":
            by_le[float(sample.labels["le"])] += sample.value
        elif sample.name == f"{name}_sum":
            total += sample.value
        elif sample.name == f"{name}_count":
            count += sample.value
    return _summary(sorted(by_le.items()), count, total)


def _summary(buckets: list[tuple[float, float]], count: float, total: float) -> HistogramSummary:
    summary = HistogramSummary(count=count, sum=total, buckets=buckets)
    summary.mean = total / count if count else None
    for attr, q in QUANTILES:
        setattr(summary, attr, histogram_quantile(q, buckets))
    return summary


def window_summary(newer: HistogramSummary, older: HistogramSummary) -> HistogramSummary:
    """The observations made between two snapshots of one cumulative histogram (what
    Prometheus' rate() over the window gives): quantiles of recent requests only.

    A counter that went down (the engine restarted) makes the window the newer alone.
    """
    before = dict(older.buckets)
    if newer.count < older.count or any(before.get(le, 0.0) > n for le, n in newer.buckets):
        return newer
    buckets = [(le, n - before.get(le, 0.0)) for le, n in newer.buckets]
    return _summary(buckets, newer.count - older.count, newer.sum - older.sum)


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse SGLang's /metrics text; metrics the engine did not report stay None."""
    samples: dict[str, list[Sample]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        if family.name.startswith(PREFIX):
            samples[family.name[len(PREFIX) :]].extend(family.samples)
    snapshot = MetricsSnapshot()
    for key, attr in SUMMED_GAUGES.items():
        setattr(snapshot, attr, _summed(samples.get(key, [])))
    for key, attr in AVERAGED_GAUGES.items():
        setattr(snapshot, attr, _averaged(samples.get(key, [])))
    _fill_counters(snapshot, samples)
    for key, attr in HISTOGRAMS.items():
        setattr(snapshot, attr, _histogram(samples.get(key, []), PREFIX + key))
    names = {s.labels["model_name"] for group in samples.values() for s in group
             if "model_name" in s.labels}
    snapshot.model_names = sorted(names)
    return snapshot


def _fill_counters(snapshot: MetricsSnapshot, samples: dict[str, list[Sample]]) -> None:
    # The parser names a counter family without `_total`; its samples keep it.
    for key, attr in COUNTERS.items():
        family = samples.get(key.removesuffix("_total"), [])
        values = [s.value for s in _leader(family) if s.name.endswith("_total")]
        setattr(snapshot, attr, sum(values) if values else None)
    _fill_by_mode(snapshot, samples.get("cuda_graph_passes", []), GRAPH_PASS_MODES)
    _fill_by_mode(snapshot, samples.get("realtime_tokens", []), REALTIME_MODES)
    graph = _group_by_dp(_leader(samples.get("is_cuda_graph", [])))
    if graph:
        snapshot.is_cuda_graph = all(values[0] >= 1 for values in graph.values())
    loads = [s.value for s in samples.get("weight_load_duration_seconds", [])]
    snapshot.weight_load_duration_seconds = max(loads) if loads else None


def _fill_by_mode(snapshot: MetricsSnapshot, family: list[Sample],
                  modes: dict[str, str]) -> None:
    """A counter labelled by mode, summed into attributes over modes and DP groups. A
    labelled counter shows a mode only once it counted, so a present family makes an
    absent mode 0."""
    totals = [s for s in _leader(family) if s.name.endswith("_total")]
    if not totals:
        return
    for attr in set(modes.values()):
        wanted = {mode for mode, a in modes.items() if a == attr}
        setattr(snapshot, attr, sum(s.value for s in totals if s.labels.get("mode") in wanted))
