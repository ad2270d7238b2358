"""Reads: lists, one deployment, its events, its summary."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import CharField, Count, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce

from appliance.engine.spec import SpecError, spec_from_dict
from appliance.engine.widths import needed_graph_widths
from appliance.runtime import series
from appliance.store.loadtime import load_report, load_text

from .models import (
    LINE_KINDS,
    NOTABLE_KINDS,
    Deployment,
    DeploymentStatus,
    Event,
    EventKind,
    MetricPoint,
    Run,
)
from .services.hostreports import host_reports
from .silence import UNKNOWN, Silence, agents_last_seen, deployment_silence
from .simulator import image_is_simulator, simulator_images_recent

MAX_SERIES_ROWS = 20_000  # a week of retention is about 12,000 rows


def deployment_list(*, status: str | None = None, versioned: bool = False) -> QuerySet[Deployment]:
    """versioned: each row with its `row_version` (deployment_row_version)."""
    deployments = Deployment.objects.all()
    if status:
        deployments = deployments.filter(status=status)
    if versioned:
        deployments = deployments.annotate(row_version=_row_version())
    return deployments


def _row_version() -> RawSQL | Value:
    # PostgreSQL's xmin: the transaction that wrote this version of the row. Every UPDATE
    # writes a new version, so it changes with any change to the row and costs nothing to
    # read; other databases have none.
    if connection.vendor != "postgresql":
        return Value(None, output_field=CharField())
    return RawSQL(f'"{Deployment._meta.db_table}".xmin::text', (), output_field=CharField())


def deployment_row_version(*, deployment: Deployment) -> str | None:
    """A token that changes whenever the row does (None where the database has none): all a
    representation made of this row alone needs for its ETag."""
    return getattr(deployment, "row_version", None)


def agent_seen() -> Subquery:
    """An annotation: the last host report of the agent watching the row (its `agent_id`),
    for the silence check in the row's own query (silence.row_silence)."""
    return Subquery(host_reports().filter(agent_id=OuterRef("agent_id"))
                    .order_by("-heartbeat_at").values("heartbeat_at")[:1])


def deployment_get(*, deployment_id: int) -> Deployment:
    return Deployment.objects.get(pk=deployment_id)


def events_after(*, deployment_id: int, after_seq: int = 0, limit: int = 500) -> list[Event]:
    return list(
        Event.objects.filter(deployment_id=deployment_id, seq__gt=after_seq).order_by("seq")[:limit]
    )


# ------------------------------------------------------------------ the log pane
#
# The detail page never replays the record: it opens at the tail and pages on demand, each
# page one keyset query on (deployment, seq) (the event_seq_unique index; rare kinds have
# the partial index event_notable). A text search over the dense kinds reads at most
# SEARCH_WINDOW seqs per request and says where it stopped, so no request scans a whole
# long log; the browser asks again from there.

TAIL_LINES = 500  # what the detail page opens with
SEARCH_WINDOW = 20_000  # seqs one text-search request reads at most
_DENSE_KINDS = frozenset(LINE_KINDS) - NOTABLE_KINDS  # log: most rows of a busy deployment


@dataclass(frozen=True)
class EventPage:
    events: list[dict[str, Any]]  # wire events, oldest first
    next_before: int | None  # the `before` of the page older than this one; None at the start
    next_after: int | None  # the `after` of the next newer page; None when asked backwards


def _line_text() -> Coalesce:
    """What a search matches: a line's text, or a marker's summary, message or status."""
    return Coalesce(KeyTextTransform("text", "payload"), KeyTextTransform("summary", "payload"),
                    KeyTextTransform("message", "payload"), KeyTextTransform("status", "payload"))


def _lines(deployment_id: int, kinds: frozenset[str], text: str) -> QuerySet[Event]:
    rows = Event.objects.filter(deployment_id=deployment_id, kind__in=sorted(kinds))
    if text:
        rows = rows.alias(line_text=_line_text()).filter(line_text__icontains=text)
    return rows


def event_tail(*, deployment_id: int, last_seq: int, limit: int = TAIL_LINES) -> list[Event]:
    """The last `limit` lines of the log up to last_seq, oldest first."""
    rows = _lines(deployment_id, frozenset(LINE_KINDS), "").filter(seq__lte=last_seq)
    return list(reversed(rows.order_by("-seq")[:limit]))


def event_history(*, deployment_id: int, limit: int, kinds: frozenset[str] = frozenset(),
                  text: str = "", before: int | None = None,
                  after: int | None = None) -> EventPage:
    """A page of lines before `before` (newest first from the end when neither is given) or
    after `after`, of `kinds` (all line kinds when empty) whose text contains `text`."""
    kinds = kinds or frozenset(LINE_KINDS)
    rows = _lines(deployment_id, kinds, text)
    if after is not None:
        page = list(rows.filter(seq__gt=after).order_by("seq")[:limit])
        return EventPage([e.to_wire() for e in page], None,
                         page[-1].seq if len(page) == limit else None)
    floor = 0
    if text and kinds & _DENSE_KINDS:
        top = before if before is not None else _last_seq(deployment_id) + 1
        floor = max(0, top - SEARCH_WINDOW)
        rows = rows.filter(seq__gte=floor)
    if before is not None:
        rows = rows.filter(seq__lt=before)
    page = list(rows.order_by("-seq")[:limit])
    page.reverse()
    if len(page) == limit:
        next_before: int | None = page[0].seq
    else:
        next_before = floor if floor > 1 else None
    return EventPage([e.to_wire() for e in page], next_before, None)


def _last_seq(deployment_id: int) -> int:
    return Deployment.objects.values_list("last_seq", flat=True).get(pk=deployment_id)


def event_last_seq(*, deployment_id: int) -> int:
    """The seq of the deployment's newest event (0 before any; every seq up to it is
    committed): where a live feed starts."""
    return _last_seq(deployment_id)


def event_log_page(*, deployment_id: int, after: int, limit: int) -> list[Event]:
    """The next `limit` lines after seq `after`, for the whole-log download."""
    rows = Event.objects.filter(deployment_id=deployment_id, seq__gt=after,
                                kind__in=sorted(LINE_KINDS))
    return list(rows.order_by("seq")[:limit])


def event_log_line(event: Event) -> str:
    """One line of the downloaded log: UTC time, seq, and the line as the page shows it."""
    p = event.payload or {}
    if event.kind == "log":
        body = str(p.get("text", ""))
        if p.get("stream") == "stderr":
            body = "[stderr] " + body
    elif event.kind == "build":
        body = "[build] " + str(p.get("text") or p.get("kind") or "")
    elif event.kind == "diagnosis":
        body = f"[diagnosis] {p.get('cause', '')}: {p.get('summary', '')} Fix: {p.get('fix', '')}"
    elif event.kind == "alert":
        body = f"[alert] {p.get('id', '')} {p.get('state', '')}: {p.get('summary', '')}"
    else:  # phase, status
        body = f"[{event.kind}] " + " ".join(
            str(p[k]) for k in ("status", "message") if p.get(k))
    return f"{event.ts.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z #{event.seq} {body}\n"


def deployment_summary(*, deployment: Deployment) -> dict[str, Any]:
    return {
        "id": deployment.pk,
        "name": deployment.name,
        "status": deployment.status,
        "phase": deployment.phase,
        "progress": deployment.progress,
        "decode_stats": deployment.decode_stats or None,
        "diagnosis": deployment.diagnosis,
        "alerts": deployment.alerts or {},  # firing now, by id, each with its raised_at
        # Kept on the row by their writers (services/metrics.py): no query here.
        "alert_history": _alert_history(deployment),
        "metrics": deployment.latest_metrics,
        "engine_url": deployment.engine_url,
        "last_seq": deployment.last_seq,
        "is_terminal": deployment.is_terminal,
        "graph_widths": graph_widths(deployment=deployment),
        # Expected weight load, and the GB/s the engine reached against the disk's rate.
        "load": (load := load_report(estimate=deployment.load_estimate or {},
                                     progress=deployment.progress or {})),
        "load_text": {key: load_text(row) for key, row in load.items()},
        # Its engine is the simulator (the test engine, not SGLang), as the detail answer
        # and every page's banner say.
        "simulator": image_is_simulator(image=deployment.image,
                                        images=simulator_images_recent()),
    }


ALERT_EVENTS = 200  # the newest alert events read for the page; alerts change seldom
FINDING_EVENTS = 100  # the findings read for the page: one per cause, a few causes a run


def deployment_findings(*, deployment: Deployment) -> list[dict[str, Any]]:
    """The current run's findings while it ran (engine warnings that change what runs,
    notes: diagnosis events with a severity, appliance.logs.engine_warnings), one per cause,
    first seen first. Read on the event_notable index, as the alerts are."""
    first = (Run.objects.filter(deployment=deployment, number=deployment.run)
             .values_list("first_seq", flat=True).first() or 1)
    rows = (Event.objects.filter(deployment_id=deployment.pk, kind=EventKind.DIAGNOSIS,
                                 seq__gte=first, payload__has_key="severity")
            .order_by("seq")[:FINDING_EVENTS])
    found: dict[str, dict[str, Any]] = {}
    for event in rows:
        p = event.payload or {}
        found.setdefault(str(p.get("cause", "")), {
            key: p.get(key, "") for key in ("cause", "severity", "summary", "fix")})
    return list(found.values())


def deployment_alerts(*, deployment_id: int) -> list[dict[str, Any]]:
    """Each alert's latest occurrence: firing ones first, then cleared ones, newest first;
    each with when it was raised and, if it was, cleared (UTC datetimes). Read from the
    alert events on the event_notable index, so a long log costs nothing here."""
    rows = Event.objects.filter(deployment_id=deployment_id, kind=EventKind.ALERT)
    return alerts_fold(events=((e.payload, e.ts) for e in rows.order_by("-seq")[:ALERT_EVENTS]))


ALERT_TIMES = ("raised_at", "cleared_at")


def alert_history_stored(*, deployment_id: int) -> list[dict[str, Any]]:
    """deployment_alerts as Deployment.alert_history keeps it."""
    return alerts_as_stored(history=deployment_alerts(deployment_id=deployment_id))


def alerts_as_stored(*, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An alert history with its times as ISO text (a JSON column holds no datetimes)."""
    return [{**a, **{k: a[k].isoformat() if a[k] else None for k in ALERT_TIMES}}
            for a in history]


def _alert_history(deployment: Deployment) -> list[dict[str, Any]]:
    return [{**a, **{k: _when(a.get(k)) for k in ALERT_TIMES}}
            for a in deployment.alert_history or []]


def alerts_fold(*, events: Iterable[tuple[dict[str, Any], datetime]]) -> list[dict[str, Any]]:
    """deployment_alerts from alert events (payload, time), newest first."""
    latest: dict[str, dict[str, Any]] = {}
    for p, ts in events:
        p = p or {}
        alert_id = str(p.get("id", ""))
        seen = latest.get(alert_id)
        if seen is None:
            latest[alert_id] = _occurrence(p, ts)
        elif seen["state"] == "resolved" and p.get("state") == "firing" and not seen["summary"]:
            # The raise of a cleared alert: its summary and fix are the ones to show.
            seen.update(summary=p.get("summary", ""), fix=p.get("fix", ""),
                        raised_at=seen["raised_at"] or _when(p.get("raised_at")) or ts)
    alerts = list(latest.values())
    alerts.sort(key=lambda a: a["cleared_at"] or a["raised_at"] or _EPOCH, reverse=True)
    return sorted(alerts, key=lambda a: a["state"] != "firing")


_EPOCH = datetime.fromtimestamp(0, tz=UTC)


def _when(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def _occurrence(p: dict[str, Any], ts: datetime) -> dict[str, Any]:
    firing = p.get("state") == "firing"
    return {"id": p.get("id", ""), "severity": p.get("severity", ""),
            "state": "firing" if firing else "resolved",
            "summary": p.get("summary", "") if firing else "",
            "fix": p.get("fix", "") if firing else "",
            "raised_at": _when(p.get("raised_at")) or (ts if firing else None),
            "cleared_at": None if firing else _when(p.get("cleared_at")) or ts,
            "cleared_summary": "" if firing else p.get("summary", "")}


def spec_graph_widths(*, spec: dict[str, Any]) -> dict[str, int]:
    """The verify graph width per role a stored spec needs (Deployment.graph_needed); empty
    where its algorithm has no known widths."""
    try:
        return needed_graph_widths(spec_from_dict(spec).engine) or {}
    except SpecError:  # a spec an older version stored: show nothing rather than fail
        return {}


def graph_widths(*, deployment: Deployment) -> list[dict[str, Any]]:
    """Per role: the verify graph width the spec needs and what the engine captured (None
    until its capture line). Empty where the spec's algorithm has no known widths."""
    needed = deployment.graph_needed
    if needed is None:  # a row from before graph_needed (parsing the spec is the cost)
        needed = spec_graph_widths(spec=deployment.spec)
    progress = deployment.progress or {}
    captured = progress.get("widths", {})
    memory = {c.get("role"): c.get("mem_usage_gb") for c in progress.get("captures", [])
              if c.get("mode") == "verify"}
    return [{"role": role, "needed": width, "captured": captured.get(role, {}).get("captured"),
             "mem_usage_gb": memory.get(role)} for role, width in needed.items()]


def metric_series(*, deployment_id: int, start: datetime, end: datetime,
                  step: float | None = None) -> list[series.MetricPoint]:
    """The deployment's points in [start, end], merged into buckets of `step` seconds
    (each stamped with its start) or as stored (2 s recent, 1 min older) without one."""
    rows = MetricPoint.objects.filter(
        deployment_id=deployment_id, ts__gte=start, ts__lte=end).order_by("ts")
    points = [row.to_point() for row in rows[:MAX_SERIES_ROWS]]
    return series.downsample(points, step) if step else points


# ------------------------------------------------------------------ the list page
#
# One query for the whole list, however long: the latest metric point of each row comes
# from two correlated subqueries on the (deployment, ts) index, not a query per row.

LIST_ROWS = 200
THROUGHPUT_FRESH = timedelta(seconds=60)  # an older point is not "current" throughput
_LIST_FIELDS = ("id", "name", "status", "algorithm", "recipe", "gpus", "created_at",
                "ready_at", "engine_url", "agent_id", "lease_until")


@dataclass(frozen=True)
class DeploymentRow:
    id: int
    name: str
    status: str
    algorithm: str
    recipe: str
    gpus: list[int]
    created_at: datetime
    ready_at: datetime | None  # while ready: when it became ready
    uptime_s: float | None  # while ready: seconds since ready_at
    throughput: float | None  # while ready: output tok/s of a point under a minute old
    throughput_at: datetime | None  # that point's time
    endpoint: str  # while ready: the engine's address on the engines' network
    # Its agent is silent (silence.py): the status shown is `unknown`, this says why.
    silent: str = ""
    replicas: str = ""  # "3 replicas (2 ready)"; empty for one engine
    model: str = ""  # the `model` clients name: the spec's served_model_name, else the name


def deployment_list_rows(*, now: datetime, limit: int = LIST_ROWS) -> list[DeploymentRow]:
    """The newest `limit` deployments with what the list shows of each, in one query (and
    one more for the agents' reports, one for the replica rows where there are any)."""
    latest = MetricPoint.objects.filter(deployment=OuterRef("pk")).order_by("-ts")
    # Replica rows are shown by their replica 0 ("3 replicas (2 ready)"), not as rows.
    ready = Q(replica_rows__status=DeploymentStatus.READY)
    rows = list(Deployment.objects.filter(replica_of__isnull=True).only(*_LIST_FIELDS)
                .annotate(point_throughput=Subquery(latest.values("throughput")[:1]),
                          point_ts=Subquery(latest.values("ts")[:1]),
                          served_name=KeyTextTransform("served_model_name",
                                                       KeyTextTransform("engine", "spec")),
                          replica_count=Count("replica_rows"),
                          replicas_ready=Count("replica_rows", filter=ready))[:limit])
    seen = agents_last_seen()
    silences = {d.pk: deployment_silence(deployment=d, seen=seen, now=now) for d in rows}
    silent = _silent_replicas([d.pk for d in rows if getattr(d, "replica_count", 0)],
                              seen, now)
    return [dataclasses.replace(_list_row(d, now, silences[d.pk]), replicas=_replicas_text(
                d, root_silent=silences[d.pk] is not None, silent=silent.get(d.pk, (0, 0))),
                model=str(getattr(d, "served_name", None) or d.name))
            for d in rows]


def _silent_replicas(roots: list[int], seen: dict[str, datetime],
                     now: datetime) -> dict[int, tuple[int, int]]:
    """Per replica 0 of `roots`: how many of its replica rows' agents are silent (their
    status reads `unknown`), and how many of those are stored ready (so not counted ready).
    One query, none without roots."""
    found: dict[int, tuple[int, int]] = {}
    if not roots:
        return found
    for d in Deployment.objects.filter(replica_of_id__in=roots).only(
            "replica_of_id", "status", "agent_id", "lease_until"):
        if d.replica_of_id is not None and deployment_silence(
                deployment=d, seen=seen, now=now) is not None:
            silent, ready = found.get(d.replica_of_id, (0, 0))
            found[d.replica_of_id] = (silent + 1,
                                      ready + (d.status == DeploymentStatus.READY))
    return found


def _replicas_text(d: Deployment, *, root_silent: bool = False,
                   silent: tuple[int, int] = (0, 0)) -> str:
    """"3 replicas (2 ready)", with "1 unknown" where agents are silent: a row whose agent
    is silent never counts as ready, whatever it last reported."""
    extra = getattr(d, "replica_count", 0)
    if not extra:
        return ""
    ready = (getattr(d, "replicas_ready", 0) - silent[1]
             + (d.status == DeploymentStatus.READY and not root_silent))
    unknown = silent[0] + root_silent
    return (f"{extra + 1} replicas ({ready} ready"
            f"{f', {unknown} unknown' if unknown else ''})")


def _list_row(d: Deployment, now: datetime, silence: Silence | None = None) -> DeploymentRow:
    if silence is not None:  # nothing on the row is current: no uptime or throughput either
        return DeploymentRow(
            id=d.pk, name=d.name, status=UNKNOWN, algorithm=d.algorithm, recipe=d.recipe,
            gpus=list(d.gpus or []), created_at=d.created_at, ready_at=None, uptime_s=None,
            throughput=None, throughput_at=None, endpoint="",
            silent=f"last known {d.status}. {silence.summary}")
    ready = d.status == DeploymentStatus.READY and d.ready_at is not None
    point_ts: datetime | None = getattr(d, "point_ts", None)
    fresh = ready and point_ts is not None and now - point_ts <= THROUGHPUT_FRESH
    return DeploymentRow(
        id=d.pk, name=d.name, status=d.status, algorithm=d.algorithm, recipe=d.recipe,
        gpus=list(d.gpus or []), created_at=d.created_at,
        ready_at=d.ready_at if ready else None,
        uptime_s=max(0.0, (now - d.ready_at).total_seconds()) if ready and d.ready_at else None,
        throughput=getattr(d, "point_throughput", None) if fresh else None,
        throughput_at=point_ts if fresh else None,
        endpoint=d.engine_url if ready else "",
    )


# ------------------------------------------------------------------ lifecycle


def deployment_load_seconds(*, deployment: Deployment) -> float | None:
    """How long its last start took to be ready (starting to ready), for the Stop warning."""
    times = deployment.status_times or {}
    try:
        began = datetime.fromisoformat(times["starting"])
        ready = datetime.fromisoformat(times["ready"])
    except (KeyError, TypeError, ValueError):
        return None
    return (ready - began).total_seconds() if ready >= began else None


def deployment_runs(*, deployment: Deployment) -> list[dict[str, Any]]:
    """Each start of the engine, oldest first, with the seqs of its events (first_seq to
    last_seq); run 1 is implied (seq 1 on) until a second run writes it."""
    runs = list(Run.objects.filter(deployment=deployment).select_related("started_by"))
    if not runs:
        runs = [Run(deployment=deployment, number=1, reason=Run.Reason.DEPLOY, first_seq=1,
                    started_at=deployment.created_at, started_by=deployment.created_by)]
    rows = []
    for i, run in enumerate(runs):
        current = run.number == deployment.run
        last = runs[i + 1].first_seq - 1 if i + 1 < len(runs) else deployment.last_seq
        rows.append({
            "number": run.number, "reason": run.reason, "first_seq": run.first_seq,
            "last_seq": last, "started_at": run.started_at.isoformat(),
            "started_by": run.started_by.get_username() if run.started_by else None,
            "outcome": deployment.status if current else run.outcome,
            "current": current,
            "diagnosis": deployment.diagnosis if current else run.diagnosis})
    return rows


# ------------------------------------------------------------------ replicas


@dataclass(frozen=True)
class ReplicaRow:
    """One engine of a deployment as its page and the API's replicas list show it."""

    id: int
    index: int
    host: str
    gpus: list[int]
    status: str
    run: int
    placement_reason: str
    throughput: float | None  # decode tok/s of its latest metric point, while ready and fresh

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "index": self.index, "host": self.host, "gpus": self.gpus,
                "status": self.status, "run": self.run,
                "placement_reason": self.placement_reason, "throughput": self.throughput}


def deployment_replicas(*, deployment: Deployment, now: datetime) -> list[ReplicaRow]:
    """Replica 0 (the deployment the row belongs to) and its replica rows, by index, each
    with its latest throughput (Deployment.latest_metrics: no series read)."""
    root = deployment.replica_of_id or deployment.pk
    rows = (Deployment.objects.filter(pk=root) | Deployment.objects.filter(replica_of_id=root))
    fields = ("id", "replica_index", "host", "gpus", "status", "run", "placement_reason",
              "latest_metrics", "agent_id", "lease_until")
    seen = agents_last_seen()
    return [_replica_row(d, now, deployment_silence(deployment=d, seen=seen, now=now))
            for d in rows.only(*fields).order_by("replica_index")]


def _replica_row(d: Deployment, now: datetime, silence: Silence | None = None) -> ReplicaRow:
    if silence is not None:  # its host's agent is silent (a lost host): nothing is current
        return ReplicaRow(id=d.pk, index=d.replica_index, host=d.host, gpus=list(d.gpus or []),
                          status=UNKNOWN, run=d.run, placement_reason=d.placement_reason,
                          throughput=None)
    point = d.latest_metrics or {}
    at = point.get("t")
    fresh = (d.status == DeploymentStatus.READY and isinstance(at, int | float)
             and now.timestamp() - at <= THROUGHPUT_FRESH.total_seconds())
    value = point.get("throughput") if fresh else None
    return ReplicaRow(id=d.pk, index=d.replica_index, host=d.host, gpus=list(d.gpus or []),
                      status=d.status, run=d.run, placement_reason=d.placement_reason,
                      throughput=float(value) if isinstance(value, int | float) else None)


def replicas_throughput(*, replicas: list[ReplicaRow]) -> float | None:
    """The deployment's decode tok/s: its ready replicas' sum; None when none has a point."""
    values = [r.throughput for r in replicas if r.throughput is not None]
    return sum(values) if values else None
