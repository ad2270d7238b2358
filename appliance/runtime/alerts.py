"""Alerts on a running engine, from its metric points and its log: what people miss.

Each alert has a stable id and fires once when its condition starts, and resolves once
when it ends; the watch reports only those transitions, so the event log gets one
event per change, not one per scrape.

- accept-collapse: the acceptance length falls well below its own baseline (a slow
  moving average of the points before), for a few points in a row.
- silent-eager: speculative decode lines say `cuda graph: False` (the log parser's
  silent-eager-verify diagnosis, which already allows batches above the largest
  captured size); resolves after several graph-backed decode lines.
- stall: no progress (engine output other than HTTP access lines, progress bars,
  phases) for `stall_s` while loading weights or capturing CUDA graphs.
- kv-high: KV token usage above 95 %.
- metrics-unreachable: the engine's /metrics failed several scrapes in a row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from appliance.runtime.series import MetricPoint

Events = list[tuple[str, dict[str, Any]]]
STALL_STATUSES = frozenset({"loading", "capturing"})
# uvicorn's access lines (the agent's own /health polls) are not progress.
_ACCESS_LINE = re.compile(r'^INFO:\s+\S+ - "[A-Z]+ \S+ HTTP/[\d.]+" \d{3}')


@dataclass
class Alert:
    id: str
    state: str  # firing | resolved
    severity: str  # warning | critical
    summary: str
    fix: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AlertRules:
    stall_s: float = 300.0
    collapse_ratio: float = 0.6  # fires below this share of the baseline ...
    recover_ratio: float = 0.85  # ... and resolves above this share
    collapse_points: int = 3  # consecutive points either way
    baseline_points: int = 10  # decoding points before a baseline counts
    baseline_alpha: float = 0.1
    kv_high: float = 0.95
    kv_clear: float = 0.90
    unreachable_after: int = 3
    eager_clear_lines: int = 5


FIXES = {
    "accept-collapse": "The drafter stopped predicting the target: check that the prompts match "
                       "the drafter's training domain, the draft model path and the block size; "
                       "if it followed an engine fault, Stop the deployment and press "
                       "Restart on its page.",
    "stall": "The engine may be hung: read its last log lines and the GPUs' utilisation "
             "(NCCL and disk reads hang quietly); stop and redeploy if it does not move.",
    "kv-high": "Requests queue or are retracted: lower --max-running-requests or the context "
               "length, raise --mem-fraction-static, or spread the model over more GPUs.",
    "metrics-unreachable": "Check that the engine is alive and runs with --enable-metrics; "
                           "charts and alerts resume when /metrics answers.",
}
SEVERITY = {"metrics-unreachable": "critical"}


class AlertWatch:
    """The alert state of one engine; feed it points, scrape failures, log events, ticks."""

    def __init__(self, rules: AlertRules | None = None, active: Iterable[str] = (),
                 now: float = 0.0) -> None:
        self.rules = rules or AlertRules()
        self.active: set[str] = set(active)  # what is firing (kept on the deployment row)
        self.baseline: float | None = None
        self.baseline_n = 0
        self.low_run = self.high_run = 0
        self.failures = 0
        self.graph_lines = 0
        self.last_activity = now
        self.status = ""

    # ------------------------------------------------------------------ transitions

    def _fire(self, alert_id: str, summary: str, fix: str = "", **evidence: Any) -> list[Alert]:
        if alert_id in self.active:
            return []
        self.active.add(alert_id)
        return [Alert(alert_id, "firing", SEVERITY.get(alert_id, "warning"), summary,
                      fix or FIXES.get(alert_id, ""), evidence)]

    def _resolve(self, alert_id: str, summary: str, **evidence: Any) -> list[Alert]:
        if alert_id not in self.active:
            return []
        self.active.discard(alert_id)
        return [Alert(alert_id, "resolved", SEVERITY.get(alert_id, "warning"), summary,
                      evidence=evidence)]

    # ------------------------------------------------------------------ inputs

    def point(self, point: MetricPoint) -> list[Alert]:
        out = self._resolve("metrics-unreachable", "The engine's /metrics answers again.")
        self.failures = 0
        out += self._acceptance(point.accept_len)
        out += self._kv(point.kv_usage)
        return out

    def scrape_failed(self, error: str) -> list[Alert]:
        self.failures += 1
        if self.failures < self.rules.unreachable_after:
            return []
        return self._fire("metrics-unreachable",
                          f"The engine's /metrics did not answer {self.failures} scrapes in a "
                          f"row: {error}", failures=self.failures, error=error)

    def events(self, events: Events, now: float) -> list[Alert]:
        """What the follower shipped: progress, the silent-eager diagnosis, decode lines."""
        out: list[Alert] = []
        for kind, payload in events:
            if _is_progress(kind, payload):
                self.last_activity = now
                out += self._resolve("stall", "The engine is making progress again.")
            if kind == "diagnosis" and payload.get("cause") == "silent-eager-verify":
                self.graph_lines = 0
                out += self._fire("silent-eager", str(payload.get("summary", "")),
                                  str(payload.get("fix", "")),
                                  **(payload.get("evidence") or {}))
            elif kind == "metric" and payload.get("kind") == "decode_stats":
                out += self._decode(payload)
        return out

    def tick(self, status: str, now: float) -> list[Alert]:
        """The stall check, every scrape interval, whatever the engine prints."""
        if status != self.status:
            self.status, self.last_activity = status, now
        if status not in STALL_STATUSES:
            return self._resolve("stall", f"The engine moved on ({status}).")
        quiet = now - self.last_activity
        if quiet < self.rules.stall_s:
            return []
        return self._fire("stall", f"No progress for {quiet:.0f} s while {status}.",
                          status=status, quiet_s=round(quiet, 1))

    # ------------------------------------------------------------------ rules

    def _acceptance(self, value: float | None) -> list[Alert]:
        if value is None:
            return []
        rules = self.rules
        if self.baseline is None or self.baseline_n < rules.baseline_points:
            self._learn(value)
            return []
        if value < rules.collapse_ratio * self.baseline:
            self.low_run, self.high_run = self.low_run + 1, 0
            if self.low_run >= rules.collapse_points:
                return self._fire(
                    "accept-collapse",
                    f"Acceptance length fell to {value:.2f} tokens per step from a baseline of "
                    f"{self.baseline:.2f}.", accept_len=round(value, 3),
                    baseline=round(self.baseline, 3))
            return []
        self.low_run = 0
        if "accept-collapse" not in self.active:
            self._learn(value)  # a slow drift moves the baseline; only a fall alerts
            return []
        self.high_run = self.high_run + 1 if value >= rules.recover_ratio * self.baseline else 0
        if self.high_run < rules.collapse_points:
            return []
        return self._resolve("accept-collapse", f"Acceptance length is back at {value:.2f}.",
                             accept_len=round(value, 3))

    def _learn(self, value: float) -> None:
        alpha = max(self.rules.baseline_alpha, 1.0 / (self.baseline_n + 1))
        self.baseline = value if self.baseline is None else (
            self.baseline + alpha * (value - self.baseline))
        self.baseline_n += 1

    def _kv(self, usage: float | None) -> list[Alert]:
        if usage is None:
            return []
        if usage > self.rules.kv_high:
            return self._fire("kv-high", f"KV cache usage is {usage:.0%}, above "
                              f"{self.rules.kv_high:.0%}.", kv_usage=round(usage, 4))
        if usage < self.rules.kv_clear:
            return self._resolve("kv-high", f"KV cache usage is down to {usage:.0%}.")
        return []

    def _decode(self, stats: dict[str, Any]) -> list[Alert]:
        if stats.get("accept_len") is None or stats.get("cuda_graph") is not True:
            self.graph_lines = 0
            return []
        self.graph_lines += 1
        if self.graph_lines < self.rules.eager_clear_lines:
            return []
        return self._resolve("silent-eager", "Speculative decoding runs on CUDA graphs again.")


def _is_progress(kind: str, payload: dict[str, Any]) -> bool:
    if kind in ("progress", "selfcheck", "phase"):
        return True
    return kind == "log" and not _ACCESS_LINE.match(str(payload.get("text", "")))
