"""Reads: lists, one deployment, its events, its summary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from appliance.engine.spec import SpecError, spec_from_dict
from appliance.engine.widths import needed_graph_widths
from appliance.runtime import series

from .models import Deployment, Event, Host, MetricPoint

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
