"""Per-level figures, defined as sglang.bench_serving's calculate_metrics defines them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from appliance.bench.client import RequestResult


def percentile(values: Sequence[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Stats:
    """Milliseconds."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Stats:
        ms = [s * 1000.0 for s in seconds]
        mean = sum(ms) / len(ms) if ms else 0.0
        return cls(mean, percentile(ms, 50), percentile(ms, 90), percentile(ms, 99))


@dataclass(frozen=True)
class LevelMetrics:
    concurrency: int
    completed: int
    errors: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # requests/s
    output_throughput: float  # output tokens/s
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    accept_len: float | None  # the server's /server_info after the level
    request_accept_len: float | None  # mean of per-request meta_info, where sent
    token_source: str  # usage | requested | chunks (the least exact one seen)
    first_error: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LevelMetrics:
        stats = {k: Stats(**data[k]) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}
        return cls(**{**data, **stats})


_SOURCE_RANK = {"usage": 0, "requested": 1, "chunks": 2}


def level_metrics(*, concurrency: int, results: Sequence[RequestResult], duration_s: float,
                  accept_len: float | None) -> LevelMetrics:
    done = [r for r in results if r.ok]
    # TPOT excludes the first token; a one-token answer has none (as bench_serving).
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in done if r.output_len > 1]
    itls = [gap for r in done for gap in r.itl]
    out_tokens = sum(r.output_len for r in done)
    per_request = [r.accept_len for r in done if r.accept_len is not None]
    sources = [r.token_source for r in done] or ["usage"]
    errors = [r.error for r in results if not r.ok]
    dur = duration_s if duration_s > 0 else float("inf")
    return LevelMetrics(
        concurrency=concurrency, completed=len(done), errors=len(errors),
        duration_s=duration_s, total_input_tokens=sum(r.input_len for r in done),
        total_output_tokens=out_tokens, request_throughput=len(done) / dur,
        output_throughput=out_tokens / dur, ttft_ms=Stats.of([r.ttft for r in done]),
        tpot_ms=Stats.of(tpots), itl_ms=Stats.of(itls),
        e2e_ms=Stats.of([r.latency for r in done]), accept_len=accept_len,
        request_accept_len=sum(per_request) / len(per_request) if per_request else None,
        token_source=max(sources, key=_SOURCE_RANK.__getitem__),
        first_error=errors[0] if errors else "")
