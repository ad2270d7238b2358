"""The appliance's own /metrics for Prometheus: access, what it exports, and the
multiprocess mode several web workers share."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from appliance.runtime import series
from tests.servers import process_env
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment, MetricPoint
from web.deployments.prom import phase_durations

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _ready_deployment() -> Deployment:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    now = timezone.now()
    times = {"queued": now - timedelta(seconds=100), "building": now - timedelta(seconds=90),
             "starting": now - timedelta(seconds=80), "loading": now - timedelta(seconds=75),
             "capturing": now - timedelta(seconds=30), "ready": now - timedelta(seconds=10)}
    Deployment.objects.filter(pk=deployment.pk).update(
        status="ready", status_times={k: v.isoformat() for k, v in times.items()},
        alerts={"kv-high": {"id": "kv-high", "severity": "warning"}})
    point = series.MetricPoint(t=now.timestamp(), throughput=303.12, accept_len=4.87,
                               running=3.0, cuda_graph=1.0, itl_p50=0.0071,
                               gpus=[[97.0, 120.5, 143.8]])
    MetricPoint.of(deployment.pk, point, 2).save()
    deployment.refresh_from_db()
    return deployment


def test_it_refuses_a_scrape_without_the_token_or_a_login(settings) -> None:  # type: ignore[no-untyped-def]
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 401 and "Bearer" in anonymous["WWW-Authenticate"]
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 401
    right = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert right.status_code == 200 and right["Content-Type"].startswith("text/plain")


def test_without_a_token_only_a_logged_in_viewer_reads_it(settings, viewer) -> None:  # type: ignore[no-untyped-def]
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    client = Client()
    client.force_login(viewer)
    assert client.get("/metrics").status_code == 200


def test_it_exports_status_phases_events_alerts_and_the_engine_per_deployment(
        settings) -> None:  # type: ignore[no-untyped-def]
    settings.METRICS_TOKEN = "t0ken"
    deployment = _ready_deployment()
    text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").content.decode()
    samples = _samples(text)
    ids = {("deployment", str(deployment.pk)), ("name", "kimi-ddtree")}

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset(ids | set(labels.items())))]

    assert value("appliance_deployment_status", status="ready") == 1.0
    assert value("appliance_deployment_status", status="loading") == 0.0
    assert value("appliance_deployment_phase_seconds", phase="load") == pytest.approx(45, abs=1)
    assert value("appliance_deployment_phase_seconds", phase="capture") == pytest.approx(20, abs=1)
    assert value("appliance_deployment_phase_seconds", phase="build") == pytest.approx(10, abs=1)
    assert value("appliance_events_written_total") == float(deployment.last_seq)
    assert value("appliance_alert_firing", alert="kv-high", severity="warning") == 1.0
    assert value("appliance_engine_output_throughput_tokens_per_second") == 303.12
    assert value("appliance_engine_spec_accept_length") == 4.87
    assert value("appliance_engine_cuda_graph") == 1.0
    assert value("appliance_engine_inter_token_latency_seconds", quantile="0.5") == 0.0071
    assert value("appliance_gpu_utilization_percent", gpu="0") == 97.0
    assert value("appliance_gpu_memory_used_bytes", gpu="0") == pytest.approx(120.5e9)
    assert ("appliance_sse_clients", frozenset()) in samples


def test_phase_durations_count_a_phase_under_way_to_now() -> None:
    now = timezone.now()
    times = {"building": (now - timedelta(seconds=50)).isoformat(),
             "starting": (now - timedelta(seconds=20)).isoformat(),
             "loading": (now - timedelta(seconds=5)).isoformat()}
    assert phase_durations(times, now) == {"build": 30.0, "load": 5.0}


HOLD = """
import os, sys, django
django.setup()
from web.deployments.prom import SSE_CLIENTS
for _ in range(int(sys.argv[1])):
    SSE_CLIENTS.inc()
print("ready", flush=True)
sys.stdin.read()
"""
SCRAPE = """
import django
django.setup()
from prometheus_client import generate_latest
from web.deployments.prom import _registry
print(generate_latest(_registry()).decode())
"""


def _python(code: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_several_web_workers_report_one_sum_of_open_streams(tmp_path: Path) -> None:
    env = process_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    workers = [_python(HOLD, env, "2"), _python(HOLD, env, "1")]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"

        def scraped() -> float:
            out = subprocess.run([sys.executable, "-c", SCRAPE], cwd=ROOT, env=env, text=True,
                                 capture_output=True, check=True).stdout
            return _samples(out)[("appliance_sse_clients", frozenset())]

        assert scraped() == 3.0
        workers[0].kill()
        workers[0].wait()
        assert scraped() == 1.0  # a worker that died is forgotten, not counted forever
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    assert os.listdir(tmp_path)  # the workers' own files
