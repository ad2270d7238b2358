"""The event log's retention: bounded storage that keeps what a diagnosis needs.

The policy (docs/events-retention.md), per deployment:
- Decode and prefill stats (the `metric` event and its log line, about two thirds of a busy
  engine's events) are folded into the metric series after EVENTS_STATS_KEEP_HOURS: a
  one-minute point for each minute the series lacks (the engine's /metrics normally has
  it), then the rows go.
- Other log lines go after EVENTS_RETENTION_DAYS, unless appliance.logs.retention keeps them
  (tracebacks, errors and warnings, phase, load and capture lines, known causes).
- Never dropped: every event of a rare kind (phase, status, diagnosis, alert, build,
  self-check, pre-flight, end), progress events, the first RUN_HEAD events of the log and of
  each run (from its `starting` phase), the last RUN_TAIL before each run's end, and CONTEXT
  events either side of each diagnosis and alert.

Ages come from the rows' ts; seq follows ts (both are set under the deployment's row lock),
so each cutoff is a seq found by a binary search on the (deployment, seq) index and every
read and DELETE here is a seq range on it. The panel loop (web/loop.py) runs events_prune
beside the metric series' pruning; `manage.py prune_events` runs it by hand.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from appliance.events import STATS_KINDS as PARSER_STATS_KINDS
from appliance.logs.retention import NOTABLE_PATTERN, LineKeeper
from appliance.runtime import series

from ..models import Deployment, Event, EventKind, MetricPoint

log = logging.getLogger(__name__)

RUN_HEAD = 2000  # events kept at the start of the log and of each run
RUN_TAIL = 500  # events kept before each run's end (the lines that tell why it ended)
CONTEXT = 50  # events kept either side of a diagnosis or an alert
DELETE_SPAN = 50_000  # seqs per DELETE: no single statement holds a huge range
SCAN_CHUNK = 5000  # rows per fetch while the log lines are sorted
BACKSCAN = 500  # seqs before the last pass's end re-read for a traceback crossing it
STATS_KINDS = tuple(sorted(PARSER_STATS_KINDS))  # the metric rows' parser kinds
_RUN_ENDS = frozenset({"stopping", "stopped", "failed"})

Range = tuple[int, int]  # inclusive seqs


@dataclass
class PruneReport:
    folded_points: int = 0  # metric-series points made from stats nothing else covered
    stats_deleted: int = 0
    lines_deleted: int = 0

    def add(self, other: PruneReport) -> None:
        self.folded_points += other.folded_points
        self.stats_deleted += other.stats_deleted
        self.lines_deleted += other.lines_deleted


def events_prune(*, now: datetime | None = None) -> PruneReport:
    """Apply the retention to every deployment's log (stopped ones too)."""
    now = now or timezone.now()
    report = PruneReport()
    for pk in Deployment.objects.filter(last_seq__gt=0).values_list("pk", flat=True):
        report.add(events_prune_deployment(deployment_id=pk, now=now))
    return report


def events_prune_deployment(*, deployment_id: int, now: datetime) -> PruneReport:
    report = PruneReport()
    stats_cut = _last_seq_before(deployment_id, now - timedelta(
        hours=settings.EVENTS_STATS_KEEP_HOURS))
    if stats_cut == 0:
        return report
    gaps = _gaps(_protected(deployment_id, stats_cut), stats_cut)
    report.folded_points = _fold_stats(deployment_id, gaps, now)
    report.stats_deleted = _delete_stats(deployment_id, gaps)
    age_cut = _last_seq_before(deployment_id, now - timedelta(
        days=settings.EVENTS_RETENTION_DAYS))
    report.lines_deleted = _age_out(deployment_id, gaps, age_cut)
    return report


_running = threading.Lock()


def events_prune_in_background() -> bool:
    """events_prune on a thread of its own (the panel loop must not wait for a first
    pass over a long backlog); False when the last one is still running."""
    if not _running.acquire(blocking=False):
        return False

    def run() -> None:
        try:
            report = events_prune()
            if report.stats_deleted or report.lines_deleted:
                log.info("event retention: %s", report)
        except Exception:  # noqa: BLE001 - the next pass tries again
            log.exception("event retention failed")
        finally:
            connection.close()
            _running.release()

    threading.Thread(target=run, name="event-retention", daemon=True).start()
    return True


# ------------------------------------------------------------------ where to cut


def _last_seq_before(pk: int, cutoff: datetime) -> int:
    """The highest seq whose event is older than cutoff (0: none is)."""
    lo = 0
    hi = Deployment.objects.values_list("last_seq", flat=True).get(pk=pk)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        row = (Event.objects.filter(deployment_id=pk, seq__gte=mid).order_by("seq")
               .values_list("seq", "ts").first())
        if row is None or row[1] >= cutoff:
            hi = mid - 1
        else:
            lo = row[0]
    return lo


def _protected(pk: int, upto: int) -> list[Range]:
    """The seq ranges never dropped: each run's head and tail, a diagnosis' surroundings."""
    ranges = [(1, RUN_HEAD)]
    notable = Event.objects.filter(
        deployment_id=pk, seq__lte=upto + RUN_HEAD,
        kind__in=[EventKind.PHASE, EventKind.END, EventKind.DIAGNOSIS, EventKind.ALERT])
    for seq, kind, payload in notable.values_list("seq", "kind", "payload"):
        status = (payload or {}).get("status")
        if kind == EventKind.PHASE and status == "starting":
            ranges.append((seq, seq + RUN_HEAD))
        elif kind == EventKind.END or status in _RUN_ENDS:
            ranges.append((max(1, seq - RUN_TAIL), seq))
        elif kind in (EventKind.DIAGNOSIS, EventKind.ALERT):
            ranges.append((max(1, seq - CONTEXT), seq + CONTEXT))
    return _merged(ranges)


def _merged(ranges: list[Range]) -> list[Range]:
    out: list[Range] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _gaps(protected: list[Range], upto: int) -> list[Range]:
    """The seqs in [1, upto] outside the protected ranges, in spans of DELETE_SPAN at most."""
    gaps, start = [], 1
    for a, b in protected + [(upto + 1, upto + 1)]:
        end = min(a - 1, upto)
        while start <= end:
            gaps.append((start, min(end, start + DELETE_SPAN - 1)))
            start = gaps[-1][1] + 1
        start = max(start, b + 1)
        if start > upto:
            break
    return gaps


# ------------------------------------------------------------------ stats into the series


def _stats(pk: int, gap: Range) -> Any:
    return Event.objects.filter(deployment_id=pk, kind=EventKind.METRIC, seq__range=gap,
                                payload__kind__in=STATS_KINDS)


def _stats_lines(pk: int, gap: Range) -> Any:
    stats_text = (Q(line__contains="Decode batch") | Q(line__contains="Prefill batch"))
    return (Event.objects.filter(deployment_id=pk, kind=EventKind.LOG, seq__range=gap)
            .alias(line=KeyTextTransform("text", "payload")).filter(stats_text)
            .exclude(line__iregex=NOTABLE_PATTERN))


def _fold_stats(pk: int, gaps: list[Range], now: datetime) -> int:
    """A one-minute series point for each minute of these stats the series has no point in
    (stats older than the series' own retention would only be dropped again)."""
    kept_from = (now - timedelta(days=settings.METRICS_RETENTION_DAYS)).timestamp()
    minutes = _minutes(pk, gaps, kept_from)
    step = series.ROLLUP_STEP_S
    points = [series.merge(group, start) for start, group in minutes]
    if not points:
        return 0
    covered = {math.floor(ts.timestamp() / step) * step for ts in MetricPoint.objects.filter(
        deployment_id=pk, ts__gte=_at(points[0].t), ts__lt=_at(points[-1].t + step),
    ).values_list("ts", flat=True)}
    new = [MetricPoint.of(pk, p, step) for p in points if p.t not in covered]
    MetricPoint.objects.bulk_create(new, batch_size=1000)
    return len(new)


def _minutes(pk: int, gaps: list[Range],
             kept_from: float) -> Iterator[tuple[float, list[series.MetricPoint]]]:
    """The stats events of the gaps as points, a minute at a time (never all in memory)."""
    step = series.ROLLUP_STEP_S
    start = 0.0
    group: list[series.MetricPoint] = []
    for gap in gaps:
        rows = _stats(pk, gap).order_by("seq").values_list("ts", "payload")
        for ts, payload in rows.iterator(chunk_size=SCAN_CHUNK):
            t = ts.timestamp()
            if t < kept_from:
                continue
            minute = float(math.floor(t / step) * step)
            if minute != start and group:
                yield start, group
                group = []
            start = minute
            group.append(_point(t, payload))
    if group:
        yield start, group


def _point(t: float, stats: dict[str, Any]) -> series.MetricPoint:
    graph = stats.get("cuda_graph")
    return series.MetricPoint(
        t=t, throughput=stats.get("gen_throughput"), accept_len=stats.get("accept_len"),
        accept_rate=stats.get("accept_rate"), running=stats.get("running_req"),
        queued=stats.get("queue_req"), kv_usage=stats.get("token_usage"),
        cuda_graph=None if graph is None else float(bool(graph)))


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def _delete_stats(pk: int, gaps: list[Range]) -> int:
    deleted = 0
    for gap in gaps:
        deleted += _stats(pk, gap).delete()[0]
        deleted += _stats_lines(pk, gap).delete()[0]
    return deleted


# ------------------------------------------------------------------ log lines by age


def _age_out(pk: int, gaps: list[Range], age_cut: int) -> int:
    """Drop the lines up to age_cut that no rule keeps, from where the last pass ended."""
    done = Deployment.objects.values_list("log_pruned_seq", flat=True).get(pk=pk)
    if age_cut <= done:
        return 0
    keeper = LineKeeper()
    rows = (Event.objects.filter(deployment_id=pk, kind=EventKind.LOG,
                                 seq__gt=max(0, done - BACKSCAN), seq__lte=age_cut)
            .annotate(line=KeyTextTransform("text", "payload")).order_by("seq")
            .values_list("seq", "line"))
    doomed: list[int] = []
    deleted = 0
    spans = iter(gaps)
    span = next(spans, None)
    for seq, text in rows.iterator(chunk_size=SCAN_CHUNK):
        keep = keeper.keep(text or "")  # fed every line: a traceback spans protected ones
        while span is not None and span[1] < seq:
            span = next(spans, None)
        if seq > done and not keep and span is not None and span[0] <= seq:
            doomed.append(seq)
        if len(doomed) >= SCAN_CHUNK:
            deleted += _delete_seqs(pk, doomed)
    deleted += _delete_seqs(pk, doomed)
    Deployment.objects.filter(pk=pk).update(log_pruned_seq=age_cut)
    return deleted


def _delete_seqs(pk: int, seqs: list[int]) -> int:
    if not seqs:
        return 0
    deleted = Event.objects.filter(deployment_id=pk, seq__in=seqs).delete()[0]
    seqs.clear()
    return deleted
