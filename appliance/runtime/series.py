"""A deployment's metric time series: one point per scrape of the engine's /metrics.

A point holds what people watch on a speculative-decoding engine: output throughput,
acceptance length and rate, running and queued requests, KV token usage, whether
CUDA graphs are in use, latency percentiles, and the deployment's GPUs (NVML).

Derivation (`Deriver`): throughputs are rates of SGLang's token counters between two
scrapes (its `gen_throughput` gauge keeps the last logged batch's value while idle): the
per-batch realtime_tokens_total where the engine has it, else the tokens of finished
requests (prompt_/generation_tokens_total, which show a long request only at its end);
latency percentiles come from the histograms' difference over the last
LATENCY_WINDOW_S, so they describe recent requests, not the engine's whole life.
Acceptance is reported only while the engine decodes (SGLang's gauge keeps its last
value when idle; an idle engine has no acceptance to speak of): tokens per verify call of
the requests that finished since the last scrape, where the engine counts verify calls
(their generated tokens less each one's first, which its prefill made), else the gauge.
The CUDA-graph share is the decode passes that replayed a graph over all decode passes
since the last scrape (sglang:cuda_graph_passes_total): None when no decode pass ran, never
a 0 for an idle engine. SGLang's is_cuda_graph gauge speaks of one batch and, on the pinned
DDTree source, of none (it reads 0.0 throughout a graphed run); it stands in only for an
engine without the pass counters, and only while it decodes.

Storage is bounded (web/deployments/services/metrics.py keeps it): points at the scrape
interval for the last RAW_KEEP_S, then one point per ROLLUP_STEP_S (`downsample`: the
mean of each field), and nothing older than the retention (default 7 days). At the
default 2 s interval a deployment's full day is 1,800 points at 2 s + 1,380 at one a
minute: 2.4 MB in PostgreSQL with 8 GPUs (765 bytes a point), 0.95 MB without GPU
readings (299 bytes), indexes included; a week of retention is 9.0 MB and 3.5 MB
(`bench/metrics_storage.py` measures it on the real database).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from appliance.engine.metrics import HistogramSummary, MetricsSnapshot, window_summary

LATENCY_WINDOW_S = 30.0
RAW_KEEP_S = 3600.0
ROLLUP_STEP_S = 60

# Scalar fields and their units (the charts, the REST API and Prometheus name them so).
UNITS: dict[str, str] = {
    "throughput": "tok/s",
    "input_throughput": "tok/s",
    "accept_len": "tokens",
    "accept_rate": "ratio",
    "running": "requests",
    "queued": "requests",
    "kv_usage": "ratio",
    "cache_hit_rate": "ratio",
    "cuda_graph": "ratio",
    "ttft_p50": "s", "ttft_p90": "s", "ttft_p99": "s",
    "itl_p50": "s", "itl_p90": "s", "itl_p99": "s",
    "e2e_p50": "s", "e2e_p90": "s", "e2e_p99": "s",
}
SCALARS = tuple(UNITS)
# Per GPU: [utilisation %, memory used GB, memory total GB]; [] when NVML is absent.
GPU_COLUMNS = ("utilization_pct", "memory_used_gb", "memory_total_gb")


@dataclass
class MetricPoint:
    t: float  # Unix seconds
    throughput: float | None = None
    input_throughput: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    running: float | None = None
    queued: float | None = None
    kv_usage: float | None = None
    cache_hit_rate: float | None = None
    cuda_graph: float | None = None  # share of decode passes on graphs 0-1; None: no pass
    ttft_p50: float | None = None
    ttft_p90: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p90: float | None = None
    itl_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p90: float | None = None
    e2e_p99: float | None = None
    gpus: list[list[float | None]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricPoint:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _rate(newer: float | None, older: float | None, dt: float) -> float | None:
    if newer is None or older is None or dt <= 0 or newer < older:
        return None
    return (newer - older) / dt


def _delta(newer: float | None, older: float | None) -> float | None:
    return _rate(newer, older, 1.0)


def _graph_passes(snap: MetricsSnapshot, older: MetricsSnapshot | None
                  ) -> tuple[float, float] | None:
    """(graph-backed, all) decode passes since the older scrape; None without counters."""
    if older is None:
        return None
    graph = _delta(snap.decode_graph_passes_total, older.decode_graph_passes_total)
    eager = _delta(snap.decode_eager_passes_total, older.decode_eager_passes_total)
    return None if graph is None or eager is None else (graph, graph + eager)


def _graph_share(snap: MetricsSnapshot, passes: tuple[float, float] | None,
                 decoding: bool) -> float | None:
    if snap.decode_graph_passes_total is not None:
        return passes[0] / passes[1] if passes and passes[1] else None
    if snap.is_cuda_graph is None or not decoding:  # an older engine: the batch's gauge
        return None
    return 1.0 if snap.is_cuda_graph else 0.0


def _accept_len(snap: MetricsSnapshot, older: MetricsSnapshot | None) -> float | None:
    """Tokens per verify call of the requests finished since the older scrape: their
    generated tokens less one each (the first comes from the prefill, no verify step)."""
    if older is None:
        return None
    verify = _delta(snap.spec_verify_calls_total, older.spec_verify_calls_total)
    tokens = _delta(snap.generation_tokens_total, older.generation_tokens_total)
    finished = _delta(snap.num_requests_total, older.num_requests_total) or 0.0
    return (tokens - finished) / verify if verify and tokens and tokens > finished else None


class Deriver:
    """Turns successive /metrics snapshots of one engine into points."""

    def __init__(self, latency_window_s: float = LATENCY_WINDOW_S) -> None:
        self.window_s = latency_window_s
        self.history: deque[tuple[float, MetricsSnapshot]] = deque()

    def derive(self, t: float, snap: MetricsSnapshot,
               gpus: list[list[float | None]] | None = None) -> MetricPoint:
        previous = self.history[-1] if self.history else None
        self.history.append((t, snap))
        while len(self.history) > 2 and self.history[1][0] <= t - self.window_s:
            self.history.popleft()
        point = MetricPoint(t=t, running=snap.num_running_reqs, queued=snap.num_queue_reqs,
                            kv_usage=snap.kv_usage, cache_hit_rate=snap.cache_hit_rate,
                            gpus=gpus or [])
        older = previous[1] if previous else None
        passes = _graph_passes(snap, older)
        decoding = self._throughputs(point, snap, previous) or bool(passes and passes[1])
        # None, or the gauge's 0 and no verify calls counted: no speculative decoding
        accept = (_accept_len(snap, older) or snap.spec_accept_length) if decoding else None
        if accept:
            point.accept_len, point.accept_rate = accept, snap.spec_accept_rate
        point.cuda_graph = _graph_share(snap, passes, decoding)
        self._latencies(point, snap)
        return point

    def _throughputs(self, point: MetricPoint, snap: MetricsSnapshot,
                     previous: tuple[float, MetricsSnapshot] | None) -> bool:
        """Fill the throughputs; True when the engine decoded since the last scrape."""
        running = snap.num_running_reqs or 0.0
        if previous is not None:
            dt = point.t - previous[0]
            older = previous[1]
            point.throughput = _rate(snap.realtime_decode_tokens_total,
                                     older.realtime_decode_tokens_total, dt) \
                if snap.realtime_decode_tokens_total is not None else \
                _rate(snap.generation_tokens_total, older.generation_tokens_total, dt)
            point.input_throughput = _rate(snap.realtime_prefill_tokens_total,
                                           older.realtime_prefill_tokens_total, dt) \
                if snap.realtime_prefill_tokens_total is not None else \
                _rate(snap.prompt_tokens_total, older.prompt_tokens_total, dt)
        if point.throughput is None and snap.generation_tokens_total is None:
            # No counter to take a rate of: the gauge, which is stale while idle.
            point.throughput = snap.gen_throughput if running else 0.0
        return running > 0 or bool(point.throughput)

    def _latencies(self, point: MetricPoint, snap: MetricsSnapshot) -> None:
        oldest = self.history[0][1]
        for name in ("ttft", "itl", "e2e"):
            newer: HistogramSummary = getattr(snap, name)
            window = window_summary(newer, getattr(oldest, name)) if oldest is not snap \
                else newer
            if window.count <= 0:
                continue
            for q in ("p50", "p90", "p99"):
                setattr(point, f"{name}_{q}", getattr(window, q))


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return sum(present) / len(present) if present else None


def _mean_gpus(rows: Sequence[list[list[float | None]]]) -> list[list[float | None]]:
    shaped = [r for r in rows if r]
    if not shaped:
        return []
    width = len(shaped[-1])
    same = [r for r in shaped if len(r) == width]  # GPUs that came or went: the last shape
    return [[_mean(r[i][c] for r in same) for c in range(len(GPU_COLUMNS))]
            for i in range(width)]


def merge(points: Sequence[MetricPoint], t: float) -> MetricPoint:
    """One point standing for `points` (a rollup bucket): each field's mean."""
    merged = MetricPoint(t=t, gpus=_mean_gpus([p.gpus for p in points]))
    for name in SCALARS:
        setattr(merged, name, _mean(getattr(p, name) for p in points))
    return merged


def downsample(points: Iterable[MetricPoint], step: float) -> list[MetricPoint]:
    """Points merged into buckets of `step` seconds, each stamped with its start."""
    buckets: dict[float, list[MetricPoint]] = {}
    for point in points:
        buckets.setdefault(math.floor(point.t / step) * step, []).append(point)
    return [merge(group, start) for start, group in sorted(buckets.items())]
