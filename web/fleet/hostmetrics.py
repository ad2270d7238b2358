"""A host's engine monitors' reports for the engines placed on it: metric points and alert
changes, each checked field by field (a clock gone wrong, a number that is not one), then
stored as the panel's own monitor stores them."""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from appliance.runtime.alerts import Alert
from appliance.runtime.series import MetricPoint
from web.deployments.models import (
    Deployment,
)
from web.deployments.services.metrics import (
    deployment_apply_alerts,
    metrics_compact,
    metrics_store_point,
)

from .hostwrites import MAX_MESSAGE, NotPlacedHere, StaleStart
from .models import FleetHost, Placement
from .services import MAX_GPUS, FleetError

# ------------------------------------------------------------ a host's engine monitor


# What one metrics call may carry: a minute of points at the default 2 s interval, the
# alerts one step of the monitor raises or clears.
MAX_POINTS = 30
MAX_ALERTS = 20
POINT_AGE_S = 3600.0  # a point older than this (or from the future) is a clock gone wrong
ALERT_STATES = frozenset({"firing", "resolved"})
ALERT_SEVERITIES = frozenset({"info", "warning", "critical"})
_ALERT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_POINT_NUMBERS = tuple(name for name in MetricPoint.__dataclass_fields__
                       if name not in ("t", "gpus"))


@dataclass(frozen=True)
class MetricsBatch:
    """A host's engine monitor's report for one start: points for the series, alerts."""

    start_token: str
    points: list[MetricPoint]
    alerts: list[Alert]
    compact: bool = False


def metrics_batch_from(body: Mapping[str, Any], *, now: float | None = None) -> MetricsBatch:
    """{start_token, points: [MetricPoint as a dict], alerts: [Alert as a dict], compact},
    checked field by field: a point's numbers finite, its time within POINT_AGE_S of now."""
    token = body.get("start_token")
    if not (isinstance(token, str) and 0 < len(token) <= 64):
        raise FleetError("start_token", "send the start token of the engine these are for")
    points, alerts = body.get("points") or [], body.get("alerts") or []
    if not (isinstance(points, list) and len(points) <= MAX_POINTS):
        raise FleetError("points", f"points is a list of up to {MAX_POINTS} metric points")
    if not (isinstance(alerts, list) and len(alerts) <= MAX_ALERTS):
        raise FleetError("alerts", f"alerts is a list of up to {MAX_ALERTS} alerts")
    at = time.time() if now is None else now
    return MetricsBatch(start_token=token,
                        points=[_point_checked(i, p, at) for i, p in enumerate(points)],
                        alerts=[_alert_checked(i, a) for i, a in enumerate(alerts)],
                        compact=body.get("compact") is True)


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _point_checked(i: int, point: Any, now: float) -> MetricPoint:
    if not isinstance(point, dict) or not _number(point.get("t")):
        raise FleetError("points", f"point {i} is an object with its Unix time t")
    if not now - POINT_AGE_S <= point["t"] <= now + 60:
        raise FleetError("points", f"point {i}: t is {point['t']}, not within an hour of the "
                         "panel's clock (check the host's clock: NTP)")
    bad = [n for n in _POINT_NUMBERS if point.get(n) is not None and not _number(point[n])]
    if bad:
        raise FleetError("points", f"point {i}: {', '.join(bad)} must be finite numbers or "
                         "null")
    gpus = point.get("gpus") or []
    if not (isinstance(gpus, list) and len(gpus) <= MAX_GPUS and all(
            isinstance(g, list) and len(g) <= 16 and all(v is None or _number(v) for v in g)
            for g in gpus)):
        raise FleetError("points", f"point {i}: gpus is a list of up to {MAX_GPUS} lists of "
                         "numbers (one per GPU)")
    return MetricPoint.from_dict({**point, "gpus": gpus})


def _alert_checked(i: int, alert: Any) -> Alert:
    if not (isinstance(alert, dict) and isinstance(alert.get("id"), str)
            and _ALERT_ID.fullmatch(alert["id"]) and alert.get("state") in ALERT_STATES
            and alert.get("severity") in ALERT_SEVERITIES):
        raise FleetError("alerts", f"alert {i} is an object with id (a slug), state "
                         f"({' or '.join(sorted(ALERT_STATES))}) and severity "
                         f"({', '.join(sorted(ALERT_SEVERITIES))})")
    texts = [alert.get(k, "") for k in ("summary", "fix")]
    evidence = alert.get("evidence") or {}
    if not (all(isinstance(t, str) and len(t) <= MAX_MESSAGE for t in texts)
            and isinstance(evidence, dict) and len(json.dumps(evidence, default=str)) <= 8192):
        raise FleetError("alerts", f"alert {i}: summary and fix are strings of {MAX_MESSAGE} "
                         "characters at most, evidence an object under 8 KiB")
    return Alert(id=alert["id"], state=alert["state"], severity=alert["severity"],
                 summary=texts[0], fix=texts[1], evidence=evidence)


def host_metrics_store(*, host: FleetHost, deployment_id: int, batch: MetricsBatch) -> int:
    """Store a host's monitor report for the current start of an engine placed on it: the
    points stored.
    NotPlacedHere for any other deployment, StaleStart for another start's report."""
    if not Placement.objects.filter(host=host, deployment_id=deployment_id).exists():
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    token = Deployment.objects.filter(pk=deployment_id).values_list(
        "start_token", flat=True).first()
    if token is None:
        raise NotPlacedHere(f"deployment {deployment_id} is not placed on host {host.name}")
    if not (token and secrets.compare_digest(token, batch.start_token)):
        raise StaleStart(f"deployment {deployment_id} is no longer on that start (it was "
                         "restarted or redeployed): these metrics are an engine's that is gone")
    resolution = max(1, round(settings.METRICS_INTERVAL_S))
    for point in batch.points:
        metrics_store_point(deployment_id=deployment_id, point=point, resolution_s=resolution)
    deployment_apply_alerts(deployment_id=deployment_id, alerts=batch.alerts)
    if batch.compact:
        metrics_compact(deployment_id=deployment_id, now=time.time())
    return len(batch.points)
