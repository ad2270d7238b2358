"""Reads: lists, one deployment, its events, its summary."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery

from appliance.engine.spec import SpecError, spec_from_dict
from appliance.engine.widths import needed_graph_widths
from appliance.runtime import series

from .models import Deployment, DeploymentStatus, Event, Host, MetricPoint

MAX_SERIES_ROWS = 20_000  # a week of retention is about 12,000 rows


def deployment_list(*, status: str | None = None) -> QuerySet[Deployment]:
    deployments = Deployment.objects.all()
    if status:
        deployments = deployments.filter(status=status)
    return deployments


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
        "alerts": deployment.alerts or {},
        "metrics": metric_latest(deployment_id=deployment.pk),
        "engine_url": deployment.engine_url,
        "last_seq": deployment.last_seq,
        "is_terminal": deployment.is_terminal,
        "graph_widths": graph_widths(deployment=deployment),
    }


def graph_widths(*, deployment: Deployment) -> list[dict[str, Any]]:
    """Per role: the verify graph width the spec needs and what the engine captured (None
    until its capture line). Empty where the spec's algorithm has no known widths."""
    try:
        needed = needed_graph_widths(spec_from_dict(deployment.spec).engine) or {}
    except SpecError:  # a spec an older version stored: show nothing rather than fail
        needed = {}
    captured = (deployment.progress or {}).get("widths", {})
    return [{"role": role, "needed": width, "captured": captured.get(role, {}).get("captured")}
            for role, width in needed.items()]


def metric_series(*, deployment_id: int, start: datetime, end: datetime,
                  step: float | None = None) -> list[series.MetricPoint]:
    """The deployment's points in [start, end], merged into buckets of `step` seconds
    (each stamped with its start) or as stored (2 s recent, 1 min older) without one."""
    rows = MetricPoint.objects.filter(
        deployment_id=deployment_id, ts__gte=start, ts__lte=end).order_by("ts")
    points = [row.to_point() for row in rows[:MAX_SERIES_ROWS]]
    return series.downsample(points, step) if step else points


def metric_latest(*, deployment_id: int) -> dict[str, Any] | None:
    row = MetricPoint.objects.filter(deployment_id=deployment_id).order_by("-ts").first()
    return row.to_point().to_dict() if row is not None else None


def hosts_list() -> list[Host]:
    """The GPU hosts whose engine agents reported, newest report first."""
    return list(Host.objects.order_by("-heartbeat_at"))


# ------------------------------------------------------------------ the list page
#
# One query for the whole list, however long: the latest metric point of each row comes
# from two correlated subqueries on the (deployment, ts) index, not a query per row.

LIST_ROWS = 200
THROUGHPUT_FRESH = timedelta(seconds=60)  # an older point is not "current" throughput
_LIST_FIELDS = ("id", "name", "status", "algorithm", "recipe", "gpus", "created_at",
                "ready_at", "engine_url")


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


def deployment_list_rows(*, now: datetime, limit: int = LIST_ROWS) -> list[DeploymentRow]:
    """The newest `limit` deployments with what the list shows of each, in one query."""
    latest = MetricPoint.objects.filter(deployment=OuterRef("pk")).order_by("-ts")
    rows = (Deployment.objects.only(*_LIST_FIELDS)
            .annotate(point_throughput=Subquery(latest.values("throughput")[:1]),
                      point_ts=Subquery(latest.values("ts")[:1]))[:limit])
    return [_list_row(d, now) for d in rows]


def _list_row(d: Deployment, now: datetime) -> DeploymentRow:
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
