"""Reads: lists, one deployment, its summary, findings, alerts and series (the log pane's reads
are logpane.py's, the list page's and replicas' rows rows.py's)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import CharField, OuterRef, QuerySet, Subquery, Value
from django.db.models.expressions import RawSQL

from appliance.engine.spec import SpecError, spec_from_dict
from appliance.engine.widths import needed_graph_widths
from appliance.runtime import series
from appliance.store.loadtime import load_report, load_text

from .models import (
    Deployment,
    Event,
    EventKind,
    MetricPoint,
    Run,
)
from .services.hostreports import host_reports
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
