"""The appliance's own /metrics for Prometheus: one target for Grafana.

What it exports, read from the database at each scrape (so every process and host
agrees, whichever web process answers): each deployment's status (one-hot), how long
its phases took (build, self-check, load, capture; from when each status began), the
events written for it (its gap-free seq), its firing alerts, and its engine's latest
metric point (throughput, acceptance, requests, KV usage, CUDA graphs, latency
percentiles, GPUs) with a deployment label. Deployments show while active and for a
day after they end.

Per-process numbers (open SSE streams) use prometheus-client's multiprocess mode when
PROMETHEUS_MULTIPROC_DIR is set (docker/panel/entrypoint.sh sets and empties it before
the web server starts): every worker writes its own file and a scrape sums the live
ones, so any number of uvicorn or gunicorn workers report one figure.

Access: `Authorization: Bearer <APPLIANCE_METRICS_TOKEN>` (for Prometheus), or a
logged-in user with the viewer role.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .models import ACTIVE_STATUSES, Deployment, DeploymentStatus, MetricPoint
from .permissions import can_view

SSE_CLIENTS = Gauge("appliance_sse_clients", "Open live event streams (SSE) to browsers.",
                    multiprocess_mode="livesum", registry=None)
# The status reads (a deployment's detail and summary), by who answered them: the ASGI path
# before Django with the body its writers stored ("asgi_stored") or rendered from the row
# ("asgi_rendered"), or Django ("django": a session, another Accept, a row the fast path
# left to it). A load test reads it to know which path it measured.
STATUS_READS_ANSWERED = Counter(
    "appliance_status_reads", "Deployment detail and summary reads, by the path that "
    "answered them.", ["answered_by"], registry=None)
ENDED_SHOWN = timedelta(days=1)
# Statuses that start a timed phase, and the phase's name.
PHASES = {"building": "build", "checking": "self_check", "loading": "load",
          "capturing": "capture"}
ENGINE_GAUGES = {
    "throughput": ("output_throughput_tokens_per_second", "Output tokens per second."),
    "input_throughput": ("input_throughput_tokens_per_second", "Prompt tokens per second."),
    "accept_len": ("spec_accept_length", "Accepted tokens per speculative verify step."),
    "accept_rate": ("spec_accept_rate", "Share of drafted tokens accepted."),
    "running": ("running_requests", "Requests being decoded."),
    "queued": ("queued_requests", "Requests waiting."),
    "kv_usage": ("kv_usage_ratio", "KV cache token usage, 0-1."),
    "cache_hit_rate": ("cache_hit_rate", "Prefix cache hit rate, 0-1."),
    "cuda_graph": ("cuda_graph", "1 while decoding runs on CUDA graphs, 0 when eager."),
}
LATENCIES = {"ttft": "ttft_seconds", "itl": "inter_token_latency_seconds",
             "e2e": "e2e_latency_seconds"}
QUANTILES = {"p50": "0.5", "p90": "0.9", "p99": "0.99"}
STALE_POINT = timedelta(seconds=60)  # an older latest point is not "now"


# ---------------------------------------------------------------- the view


def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse(
            "Send Authorization: Bearer <APPLIANCE_METRICS_TOKEN>, or log in as a viewer.\n",
            status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="appliance metrics"'
        return response
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)


def _allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    sent = request.headers.get("Authorization", "")
    if token and sent.startswith("Bearer ") and hmac.compare_digest(
            sent[len("Bearer "):].strip().encode(), token.encode()):
        return True
    return bool(request.user.is_authenticated and can_view(request.user))


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(DeploymentCollector())
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        _forget_dead_processes(path)
        multiprocess.MultiProcessCollector(registry, path=path)
    else:
        registry.register(SSE_CLIENTS)
        registry.register(STATUS_READS_ANSWERED)
    return registry


def _forget_dead_processes(path: str) -> None:
    """A worker that died without a goodbye leaves its live gauges' files: drop them."""
    for name in os.listdir(path):
        match = re.fullmatch(r"gauge_live\w*?_(\d+)\.db", name)
        if match and not _alive(int(match.group(1))):
            multiprocess.mark_process_dead(int(match.group(1)), path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- from the database


def phase_durations(times: dict[str, str], now: datetime) -> dict[str, float]:
    """Seconds each phase took, from when each status began; one under way counts to now."""
    stamps = sorted((datetime.fromisoformat(t), status) for status, t in times.items())
    out: dict[str, float] = {}
    for i, (began, status) in enumerate(stamps):
        if status in PHASES:
            ended = stamps[i + 1][0] if i + 1 < len(stamps) else now
            out[PHASES[status]] = max(0.0, (ended - began).total_seconds())
    return out


class DeploymentCollector(Collector):
    """Deployment and engine metrics, read from the database at each scrape."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        deployments = list(Deployment.objects.filter(
            Q(status__in=ACTIVE_STATUSES) | Q(ended_at__gte=now - ENDED_SHOWN)).order_by("pk"))
        yield from self._deployments(deployments, now)
        yield from _engines([d for d in deployments if d.status == DeploymentStatus.READY], now)

    def _deployments(self, deployments: list[Deployment], now: datetime) -> Iterator[Metric]:
        labels = ["deployment", "name"]
        status = GaugeMetricFamily("appliance_deployment_status",
                                   "1 for the deployment's current status.",
                                   labels=[*labels, "status"])
        phases = GaugeMetricFamily("appliance_deployment_phase_seconds",
                                   "How long each phase took (build, self_check, load, "
                                   "capture); one under way counts to now.",
                                   labels=[*labels, "phase"])
        events = CounterMetricFamily("appliance_events_written",
                                     "Events written to the deployment's log.", labels=labels)
        alerts = GaugeMetricFamily("appliance_alert_firing", "1 per firing alert.",
                                   labels=[*labels, "alert", "severity"])
        for d in deployments:
            ids = [str(d.pk), d.name]
            for choice in DeploymentStatus.values:
                status.add_metric([*ids, choice], 1.0 if d.status == choice else 0.0)
            for phase, seconds in phase_durations(d.status_times or {}, now).items():
                phases.add_metric([*ids, phase], seconds)
            events.add_metric(ids, float(d.last_seq))
            for alert_id, alert in (d.alerts or {}).items():
                alerts.add_metric([*ids, alert_id, str(alert.get("severity", ""))], 1.0)
        yield from (status, phases, events, alerts)


def _engines(ready: list[Deployment], now: datetime) -> Iterator[Metric]:
    labels = ["deployment", "name"]
    gauges = {field: GaugeMetricFamily(f"appliance_engine_{name}", text, labels=labels)
              for field, (name, text) in ENGINE_GAUGES.items()}
    latencies = {key: GaugeMetricFamily(f"appliance_engine_{name}",
                                        "Recent requests' latency percentiles (30 s window).",
                                        labels=[*labels, "quantile"])
                 for key, name in LATENCIES.items()}
    gpu = _gpu_families()
    for d in ready:
        point = MetricPoint.objects.filter(deployment=d, ts__gte=now - STALE_POINT).order_by(
            "-ts").first()
        if point is None:
            continue
        ids = [str(d.pk), d.name]
        for field, family in gauges.items():
            _add(family, ids, getattr(point, field))
        for key, family in latencies.items():
            for q, label in QUANTILES.items():
                _add(family, [*ids, label], getattr(point, f"{key}_{q}"))
        _add_gpus(gpu, ids, point.gpus or [], [str(g) for g in d.gpus or []])
    yield from (*gauges.values(), *latencies.values(), *gpu)


def _gpu_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    labels = ["deployment", "name", "gpu"]
    return (GaugeMetricFamily("appliance_gpu_utilization_percent",
                              "GPU utilisation (NVML).", labels=labels),
            GaugeMetricFamily("appliance_gpu_memory_used_bytes", "GPU memory used (NVML).",
                              labels=labels),
            GaugeMetricFamily("appliance_gpu_memory_total_bytes", "GPU memory (NVML).",
                              labels=labels))


def _add_gpus(families: tuple[GaugeMetricFamily, ...], ids: list[str],
              gpus: list[list[Any]], names: list[str]) -> None:
    util, used, total = families
    for index, row in enumerate(gpus):
        labels = [*ids, names[index] if index < len(names) else str(index)]
        _add(util, labels, row[0])
        _add(used, labels, row[1] * 1e9 if row[1] is not None else None)
        _add(total, labels, row[2] * 1e9 if row[2] is not None else None)


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))
