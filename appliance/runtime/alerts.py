"""Alerts on a running engine, from its metric points and its log: what people miss.

Each alert has a stable id and fires once when its condition starts, and resolves once
when it ends; the watch reports only those transitions, so the event log gets one
event per change, not one per scrape.

- accept-collapse: the acceptance length falls well below its own baseline (a slow
  moving average of the points before), for a few points in a row.
- accept-low: a speculative engine's acceptance length stays below LOW_ACCEPT_LEN for a few
  points in a row from the start (no fall to see: a drafter not trained for its target, as
  the recordings' wrong-drafter run shows); the alert names the drafter and the fix.
- silent-eager: decode passes run without CUDA graphs. From /metrics: the points' graph
  share (decode passes that replayed a graph, sglang:cuda_graph_passes_total) below
  eager_share for eager_points points in a row, batches above the largest captured size
  excepted; resolves after as many points at eager_recover or above. From the log: the
  parser's silent-eager-verify diagnosis (speculative decode lines saying `cuda graph:
  False`); resolves after several graph-backed decode lines. A point without a share
  (no decode pass since the last scrape: idle) changes nothing. Its summary and fix say the
  cause the evidence shows (appliance.logs.eager_causes): a verify width the graph was not
  captured at (then the recipe is the fix), or neither cause below (no recipe change).
- eager-by-spec (info): the spec turned CUDA graphs off (expect_cuda_graph False, or the
  log's cuda-graphs-disabled): a note with the speed cost, raised once, not a fault.
- eager-above-max-bs (info): eager passes while batches exceed the largest captured batch
  size (cuda_graph_max_bs): by design; resolves when the passes are back on graphs.
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

from appliance.events import (
    CAPTURE_BEGIN,
    CAPTURE_PROGRESS,
    DECODE_STATS,
    DIAGNOSIS,
    LOG,
    METRIC,
    PHASE,
    PROGRESS,
    SELFCHECK,
)
from appliance.lifecycle import Status
from appliance.logs.eager_causes import EAGER_CAUSES, RECIPE_FIX
from appliance.runtime.series import MetricPoint

EAGER_BY_CAUSE = {cause.id: cause for cause in EAGER_CAUSES}

Events = list[tuple[str, dict[str, Any]]]
STALL_STATUSES = frozenset({Status.LOADING, Status.CAPTURING})  # the phases that must show progress
# uvicorn's access lines (the agent's own /health polls) are not progress.
_ACCESS_LINE = re.compile(r'^INFO:\s+\S+ - "[A-Z]+ \S+ HTTP/[\d.]+" \d{3}')


@dataclass
class Alert:
    id: str
    state: str  # firing | resolved
    severity: str  # info | warning | critical
    summary: str
    fix: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Below this many tokens per verify step speculation paid in no recording of the real engine
# (tests/fixtures/real-engine/433c58ed7): drafters not trained for their target accepted
# 1.00 to 1.17 (random weights) and 1.04 (trained_wrong: the trained drafter on another
# target), the trained pair 3.76 to 4.93; a step's cost put break-even at 2.2 (DFLASH on the
# trained pair, c=1) to 2.5 (DFLASH, random weights) tokens per step.
LOW_ACCEPT_LEN = 1.5


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
    expect_cuda_graph: bool = True  # False: the spec disables graphs, eager is no fault
    eager_share: float = 0.5  # fires below this share of decode passes on graphs ...
    eager_recover: float = 0.9  # ... and resolves at or above this one
    eager_points: int = 3  # consecutive points with decode passes either way
    # The spec's drafter (speculative_draft_model_path); "" for no speculation: accept-low
    # then never fires.
    drafter: str = ""
    low_accept: float = LOW_ACCEPT_LEN
    low_points: int = 3  # consecutive decoding points either way


FIXES = {
    "accept-collapse": "The drafter stopped predicting the target: check that the prompts match "
                       "the drafter's training domain, the draft model path and the block size; "
                       "if it followed an engine fault, Stop the deployment and press "
                       "Restart on its page.",
    "accept-low": "Deploy the drafter trained for this target (the spec's "
                  "speculative_draft_model_path: a DFlash drafter uses the target's embedding "
                  "and head, so it must be trained on this target's own outputs), check its "
                  "block size and target layers, or serve this model without speculation "
                  "(algorithm NONE) until then.",
    "stall": "The engine may be hung: read its last log lines and the GPUs' utilisation "
             "(NCCL and disk reads hang quietly); stop and redeploy if it does not move.",
    "kv-high": "Requests queue or are retracted: lower --max-running-requests or the context "
               "length, raise --mem-fraction-static, or spread the model over more GPUs.",
    "metrics-unreachable": "Check that the engine is alive and runs with --enable-metrics; "
                           "charts and alerts resume when /metrics answers.",
    "silent-eager": "The engine decodes without its CUDA graphs and neither the spec nor the "
                    "batch size explains it: read the capture lines of the log (the Capture "
                    "widths card shows each role's captured and needed width) and the lines "
                    "before the first eager decode line; the recipe is not shown to be the "
                    "cause.",
    "eager-by-spec": EAGER_BY_CAUSE["cuda-graphs-disabled"].fix,
    "eager-above-max-bs": EAGER_BY_CAUSE["eager-above-max-bs"].fix,
}
SEVERITY = {"metrics-unreachable": "critical", "eager-by-spec": "info",
            "eager-above-max-bs": "info"}
# The log's eager-decoding causes (appliance.logs.eager_causes) -> the alert each raises.
EAGER_ALERT_OF = {"silent-eager-verify": "silent-eager", "cuda-graphs-disabled": "eager-by-spec",
                  "eager-above-max-bs": "eager-above-max-bs"}


class AlertWatch:
    """The alert state of one engine; feed it points, scrape failures, log events, ticks."""

    def __init__(self, rules: AlertRules | None = None, active: Iterable[str] = (),
                 now: float = 0.0) -> None:
        self.rules = rules or AlertRules()
        self.active: set[str] = set(active)  # what is firing (kept on the deployment row)
        self.baseline: float | None = None
        self.baseline_n = 0
        self.low_run = self.high_run = 0
        self.weak_run = self.strong_run = 0  # accept-low's runs of points below / above
        self.failures = 0
        self.graph_lines = 0
        self.eager_run = self.graph_run = 0
        # Who raised silent-eager (log | metrics): only the same source clears it, so a log
        # saying "cuda graph: True" never clears what the pass counters still show.
        self.eager_by = ""  # unknown for an alert still firing from before: either clears
        self.max_captured_bs = 0  # the largest batch size seen in capture progress
        # The log said graphs are off by the spec (server_args): eager is then no fault,
        # whatever the rules were told.
        self.graphs_off = False
        # The target's verify capture at another width than the spec needs, if one was seen.
        self.width_mismatch: tuple[int, int] | None = None
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
        out += self._low_acceptance(point.accept_len)
        out += self._kv(point.kv_usage)
        out += self._graph_share(point)
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
            if kind == PROGRESS and payload.get("kind") == CAPTURE_PROGRESS:
                self.max_captured_bs = max(self.max_captured_bs, int(payload.get("bs") or 0))
            elif kind == PROGRESS and payload.get("kind") == CAPTURE_BEGIN:
                self._capture(payload)
            alert_id = EAGER_ALERT_OF.get(str(payload.get("cause"))) if kind == DIAGNOSIS \
                else None
            if alert_id == "eager-by-spec":
                self.graphs_off = True
            if alert_id == "silent-eager":
                self.graph_lines = 0
                self.eager_by = self.eager_by or "log"
            if alert_id is not None:
                out += self._fire(alert_id, str(payload.get("summary", "")),
                                  str(payload.get("fix", "")),
                                  **(payload.get("evidence") or {}))
            elif kind == METRIC and payload.get("kind") == DECODE_STATS:
                out += self._decode(payload)
        return out

    def _capture(self, payload: dict[str, Any]) -> None:
        captured, needed = payload.get("num_tokens_per_req"), payload.get("needed_tokens_per_req")
        if (payload.get("role") == "target" and payload.get("mode") == "verify"
                and isinstance(captured, int) and isinstance(needed, int) and captured != needed):
            self.width_mismatch = (captured, needed)

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

    def _low_acceptance(self, value: float | None) -> list[Alert]:
        rules = self.rules
        # Below 1 no verify step has run yet (SGLang's gauge is 0 before the first).
        if not rules.drafter or value is None or value < 1.0:
            return []
        if value < rules.low_accept:
            self.weak_run, self.strong_run = self.weak_run + 1, 0
            if self.weak_run < rules.low_points:
                return []
            return self._fire(
                "accept-low",
                f"Acceptance length is {value:.2f} tokens per step, below {rules.low_accept:g}: "
                f"the drafter {rules.drafter} barely predicts this target, so every verify "
                "step costs more than it saves (slower than no speculation).",
                accept_len=round(value, 3), drafter=rules.drafter)
        self.weak_run, self.strong_run = 0, self.strong_run + 1
        if self.strong_run < rules.low_points:
            return []
        return self._resolve("accept-low", f"Acceptance length is up at {value:.2f} tokens "
                             f"per step.", accept_len=round(value, 3))

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

    def _graph_share(self, point: MetricPoint) -> list[Alert]:
        share, rules = point.cuda_graph, self.rules
        if share is None:
            return []  # no decode pass since the last scrape
        if not rules.expect_cuda_graph or self.graphs_off:
            if share >= rules.eager_share:
                return []
            return self._fire(
                "eager-by-spec", "CUDA graphs are off by the spec (engine.disable_cuda_graph): "
                f"{share:.0%} of the decode passes ran on graphs since the last scrape, as "
                "asked (sglang:cuda_graph_passes_total).", cuda_graph_share=round(share, 3))
        above = bool(self.max_captured_bs and point.running
                     and point.running > self.max_captured_bs)
        self.eager_run = self.eager_run + 1 if share < rules.eager_share else 0
        self.graph_run = self.graph_run + 1 if share >= rules.eager_recover else 0
        if self.eager_run >= rules.eager_points and above:
            return self._fire(
                "eager-above-max-bs", f"{point.running:.0f} running requests, above the "
                f"largest captured batch size {self.max_captured_bs}: {share:.0%} of the decode "
                "passes ran on CUDA graphs since the last scrape (eager by design).",
                cuda_graph_share=round(share, 3), running=point.running,
                max_captured_bs=self.max_captured_bs)
        if self.eager_run >= rules.eager_points:
            self.eager_by = self.eager_by or "metrics"
            return self._fire("silent-eager", *self._eager_cause(share),
                              cuda_graph_share=round(share, 3), running=point.running)
        if self.graph_run >= rules.eager_points:
            out = self._resolve("eager-above-max-bs", "The decode passes run on CUDA graphs "
                                "again.", cuda_graph_share=round(share, 3))
            if self.eager_by != "log":
                out += self._resolve_eager(f"{share:.0%} of the decode passes run on CUDA "
                                           "graphs again.", cuda_graph_share=round(share, 3))
            return out
        return []

    def _eager_cause(self, share: float) -> tuple[str, str]:
        """The silent-eager summary and fix from the pass counters and what the log showed."""
        rules = self.rules
        summary = (f"The engine decodes eagerly: {share:.0%} of its decode passes ran on CUDA "
                   f"graphs since the last scrape, under {rules.eager_share:.0%} for "
                   f"{self.eager_run} scrapes in a row (sglang:cuda_graph_passes_total)")
        if self.width_mismatch is None:
            return summary + ".", FIXES["silent-eager"]
        captured, needed = self.width_mismatch
        return (f"{summary}; the target's verify graph was captured {captured} tokens wide and "
                f"the tree needs {needed}."), RECIPE_FIX

    def _decode(self, stats: dict[str, Any]) -> list[Alert]:
        if stats.get("accept_len") is None or stats.get("cuda_graph") is not True:
            self.graph_lines = 0
            return []
        self.graph_lines += 1
        if self.graph_lines < self.rules.eager_clear_lines or self.eager_by == "metrics":
            return []
        return self._resolve_eager("Speculative decoding runs on CUDA graphs again.")

    def _resolve_eager(self, summary: str, **evidence: Any) -> list[Alert]:
        self.eager_by = ""
        return self._resolve("silent-eager", summary, **evidence)


def _is_progress(kind: str, payload: dict[str, Any]) -> bool:
    if kind in (PROGRESS, SELFCHECK, PHASE):
        return True
    return kind == LOG and not _ACCESS_LINE.match(str(payload.get("text", "")))
