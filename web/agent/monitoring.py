"""The engine agent's monitor of one engine (appliance.runtime.monitor), on the database.

Started beside the engine's follower and ended with it: it reads the follower's view
of the deployment (status, engine URL), stores points and alerts through the metrics
services, and compacts the deployment's series once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from django.conf import settings
from django.db import connection as db_connection

from appliance.runtime import series
from appliance.runtime.alerts import Alert
from appliance.runtime.monitor import EngineMonitor, MonitorOptions
from appliance.runtime.monitor import monitor_options as runtime_monitor_options
from web.deployments.models import Deployment
from web.deployments.services.metrics import (
    deployment_apply_alerts,
    metrics_compact,
    metrics_store_point,
)

log = logging.getLogger(__name__)
COMPACT_EVERY_S = 60.0


class Followed(Protocol):
    """What the follower's sink knows of the deployment, kept current by the follower."""

    status: str
    engine_url: str


def monitor_options(*, disable_cuda_graph: bool = False, drafter: str = "") -> MonitorOptions:
    """The settings' interval and stall limit, for one deployment."""
    return runtime_monitor_options(interval_s=settings.METRICS_INTERVAL_S,
                                   stall_s=float(settings.ALERT_STALL_S),
                                   disable_cuda_graph=disable_cuda_graph, drafter=drafter)


class _MonitorSink:
    def __init__(self, pk: int, followed: Followed, agent_id: str, pooled: bool) -> None:
        self.pk = pk
        self.followed = followed
        self.agent_id = agent_id
        self.pooled = pooled
        self.resolution_s = max(1, round(settings.METRICS_INTERVAL_S))
        self.compacted_at = time.monotonic()

    def status(self) -> str:
        return self.followed.status

    def engine_url(self) -> str:
        return self.followed.engine_url

    def store(self, point: series.MetricPoint) -> None:
        try:
            metrics_store_point(deployment_id=self.pk, point=point,
                                resolution_s=self.resolution_s)
            if time.monotonic() - self.compacted_at > COMPACT_EVERY_S:
                self.compacted_at = time.monotonic()
                metrics_compact(deployment_id=self.pk, now=time.time())
        finally:
            self._release()

    def alerts(self, alerts: list[Alert]) -> None:
        try:
            for alert in alerts:
                log.info("deployment %s: alert %s %s: %s", self.pk, alert.id, alert.state,
                         alert.summary)
            deployment_apply_alerts(deployment_id=self.pk, alerts=alerts, agent_id=self.agent_id)
        finally:
            self._release()

    def _release(self) -> None:
        if self.pooled:
            db_connection.close()  # back to the pool between intervals


class MonitorHandle:
    """A running monitor thread; stop() ends it (the follower ended)."""

    def __init__(self, monitor: EngineMonitor, pk: int) -> None:
        self.monitor = monitor
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"engine-monitor-{pk}",
                                       daemon=True)

    def _run(self) -> None:
        try:
            self.monitor.run(self.stop_event)
        finally:
            db_connection.close()

    def observe(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            self.monitor.observe(events)
        except Exception:  # noqa: BLE001 - an alert must never stop the log from shipping
            log.exception("engine monitor: alert from the log failed")

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)


def _drafter(deployment: Deployment) -> str:
    """The spec's drafter where it speculates (what the acceptance alert names)."""
    options = deployment.engine_options
    if str(options.get("speculative_algorithm") or "NONE").upper() == "NONE":
        return ""
    return str(options.get("speculative_draft_model_path") or "")


def monitor_start(*, deployment: Deployment, followed: Followed, agent_id: str,
                  pooled: bool) -> MonitorHandle:
    sink = _MonitorSink(deployment.pk, followed, agent_id, pooled)
    gpus = [int(g) for g in deployment.gpus or [] if str(g).isdigit()]
    monitor = EngineMonitor(sink, gpus=gpus if settings.ENGINE_GPU_REQUESTS else [],
                            options=monitor_options(disable_cuda_graph=bool(
                                deployment.engine_options.get("disable_cuda_graph")),
                                drafter=_drafter(deployment)),
                            active_alerts=list((deployment.alerts or {}).keys()))
    handle = MonitorHandle(monitor, deployment.pk)
    handle.thread.start()
    return handle
