"""Writes: a deployment's metric points (stored bounded, published live) and its alerts.

Points arrive from the engine agent's monitor every scrape interval. They are kept at
that resolution for series.RAW_KEEP_S, then merged into one point per minute
(metrics_compact) and dropped after the retention (metrics_prune); the figures are in
appliance/runtime/series.py. Points go to browsers over the live channel only: the
event log stays a record of what happened, not a scrape log.

Alerts (appliance.runtime.alerts) are kept twice: the firing ones on the deployment row
(Prometheus, the engine monitor's restart), every change as an `alert` event carrying
raised_at (and cleared_at): the panel shows each alert's latest raise and clear from those.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from appliance.runtime import series
from appliance.runtime.alerts import Alert

from .. import live
from ..models import Deployment, EventKind, MetricPoint
from ..selectors import alert_history_stored
from .events import events_append
from .reads import deployment_status_bodies_later


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def metrics_store_point(*, deployment_id: int, point: series.MetricPoint,
                        resolution_s: int) -> None:
    """Store a point, keep it as the row's latest (the summary reads it there), publish it."""
    with transaction.atomic():
        MetricPoint.of(deployment_id, point, resolution_s).save()
        Deployment.objects.filter(pk=deployment_id).update(latest_metrics=point.to_dict())
        deployment_status_bodies_later(deployment_id=deployment_id)  # the stored status bodies
    live.publish_point(deployment_id, point.to_dict())


def metrics_compact(*, deployment_id: int, now: float) -> int:
    """Merge a deployment's points older than RAW_KEEP_S into one per minute; returns how
    many were merged. Only whole minutes are merged, so a minute is merged once."""
    step = series.ROLLUP_STEP_S
    cutoff = math.floor((now - series.RAW_KEEP_S) / step) * step
    with transaction.atomic():
        raw = MetricPoint.objects.filter(
            deployment_id=deployment_id, resolution_s__lt=step, ts__lt=_at(cutoff))
        points = [row.to_point() for row in raw.select_for_update().order_by("ts")]
        if not points:
            return 0
        MetricPoint.objects.bulk_create(
            [MetricPoint.of(deployment_id, p, step) for p in series.downsample(points, step)])
        raw.delete()
    return len(points)


def metrics_prune(*, now: float) -> None:
    """Compact every deployment's old points (stopped ones too) and drop those past the
    retention (APPLIANCE_METRICS_RETENTION_DAYS)."""
    old = _at(now - series.RAW_KEEP_S - series.ROLLUP_STEP_S)
    stale = MetricPoint.objects.filter(resolution_s__lt=series.ROLLUP_STEP_S, ts__lt=old)
    for pk in set(stale.values_list("deployment_id", flat=True)):
        metrics_compact(deployment_id=pk, now=now)
    expired = _at(now) - timedelta(days=settings.METRICS_RETENTION_DAYS)
    MetricPoint.objects.filter(ts__lt=expired).delete()


def deployment_apply_alerts(*, deployment_id: int, alerts: list[Alert],
                            agent_id: str | None = None) -> bool:
    """Record alert changes: the row's firing set and one `alert` event each.

    With agent_id, only while that agent holds the deployment's lease (a successor's
    monitor reports from then on); False when it does not.
    """
    if not alerts:
        return True
    with transaction.atomic():
        rows = Deployment.objects.select_for_update().filter(pk=deployment_id)
        if agent_id is not None:
            rows = rows.filter(agent_id=agent_id)
        firing = rows.values_list("alerts", flat=True).first()
        if firing is None:
            return False
        firing = dict(firing)
        now = timezone.now().isoformat()
        events = []
        for alert in alerts:
            # Each event says when its alert was raised (and cleared): the page and the API
            # show both without pairing events up.
            if alert.state == "firing":
                firing[alert.id] = {**alert.to_dict(), "raised_at": now}
                events.append((EventKind.ALERT, firing[alert.id]))
            else:
                raised = firing.pop(alert.id, {})
                events.append((EventKind.ALERT, {**alert.to_dict(), "cleared_at": now,
                                                 "raised_at": _raised_at(raised)}))
        events_append(deployment_id=deployment_id, events=events)
        # The summary's history, folded once here rather than on every read of it.
        Deployment.objects.filter(pk=deployment_id).update(
            alerts=firing, alert_history=alert_history_stored(deployment_id=deployment_id))
    return True


def _raised_at(entry: dict[str, Any]) -> str | None:
    return entry.get("raised_at") or entry.get("since")  # "since": rows an older version wrote
