"""Benchmark runs through the REST API: create (400 naming the field), run against two
paced loopback servers (an A/B), progress, speedups, export, cancel, permissions; runs
whose engine cannot be reached or whose requests fail, on the API and the pages."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from rest_framework.test import APIClient

from tests.specs import spec
from web import tasks
from web.benchmarks import services
from web.benchmarks.models import BenchmarkRun, BenchmarkStatus
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def paced_pair() -> Iterator[tuple[str, str]]:
    procs = [subprocess.Popen([sys.executable, "-m", "appliance.bench.paced", "0.02", tpot],
                              stdout=subprocess.PIPE, text=True) for tpot in ("0.002", "0.004")]
    try:
        yield tuple(p.stdout.readline().strip() for p in procs)  # type: ignore[union-attr,return-value]
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def _ready(name: str, url: str) -> Deployment:
    return Deployment.objects.create(name=name, spec=spec(name=name), recipe="r",
                                     algorithm="DDTREE", status=DeploymentStatus.READY,
                                     engine_url=url, image="img:1")


def _client(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_bad_level_or_a_deployment_not_ready_is_a_400_naming_the_field(operator) -> None:  # type: ignore[no-untyped-def]
    fast = _ready("fast", "http://127.0.0.1:9")
    client = _client(operator)
    r = client.post("/api/benchmarks/", {"deployments": [fast.pk], "levels": [0]}, format="json")
    assert r.status_code == 400 and "levels" in r.json()
    r = client.post("/api/benchmarks/", {"deployments": [fast.pk + 99]}, format="json")
    assert r.status_code == 400 and "deployments" in r.json()
    r = client.post("/api/benchmarks/", {"deployments": [fast.pk], "prompt_source": "jsonl",
                                         "prompts": "{nope"}, format="json")
    assert r.status_code == 400 and "prompts" in r.json()


def test_a_viewer_reads_but_cannot_run(viewer) -> None:  # type: ignore[no-untyped-def]
    client = _client(viewer)
    assert client.get("/api/benchmarks/").status_code == 200
    assert client.post("/api/benchmarks/", {"deployments": [1]}, format="json").status_code == 403


@pytest.mark.exclusive  # TPOT 2 ms against 4 ms: other workers' CPU use skews both
def test_an_ab_run_reports_the_speedup_per_level_and_exports(operator, paced_pair) -> None:  # type: ignore[no-untyped-def]
    fast, slow = _ready("fast", paced_pair[0]), _ready("slow", paced_pair[1])
    client = _client(operator)
    with mock.patch.object(tasks, "benchmark_run_later"):
        r = client.post("/api/benchmarks/", {
            "deployments": [fast.pk, slow.pk], "baseline": slow.pk, "levels": [1, 4],
            "num_prompts": 8, "input_len": 16, "output_len": 32, "mode": "interleaved"},
            format="json")
    assert r.status_code == 201, r.content
    run_id = r.json()["id"]
    assert services.benchmark_run(run_id=run_id) == "done"
    run = client.get(f"/api/benchmarks/{run_id}/").json()
    assert run["status"] == "done" and run["targets"][0]["image"] == "img:1"
    rows = run["results"]["speedups"]
    assert [r["concurrency"] for r in rows] == [1, 4]
    for row in rows:  # TPOT 2 ms against 4 ms
        assert row["tpot_ratio"] == pytest.approx(2.0, rel=0.1)
        assert row["throughput_ratio"] > 1.3
    csv = client.get(f"/api/benchmarks/{run_id}/export.csv/").content.decode()
    assert csv.splitlines()[0].startswith("target,concurrency") and len(csv.splitlines()) == 5


def test_a_queued_run_cancels_at_once(operator, paced_pair) -> None:  # type: ignore[no-untyped-def]
    fast = _ready("fast", paced_pair[0])
    with mock.patch.object(tasks, "benchmark_run_later"):
        run = services.benchmark_create(deployment_ids=[fast.pk], config={
            "levels": [1], "num_prompts": 1, "input_len": 4, "output_len": 4,
            "prompt_source": "synthetic", "mode": "back_to_back", "warmup": 0, "seed": 0,
            "request_rate": None})
    r = _client(operator).post(f"/api/benchmarks/{run.pk}/cancel/")
    assert r.status_code == 202 and r.json()["status"] == BenchmarkStatus.CANCELLED
    assert services.benchmark_run(run_id=run.pk) == "not queued"
    assert BenchmarkRun.objects.get(pk=run.pk).status == BenchmarkStatus.CANCELLED


@pytest.fixture
def failing_server(request) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A paced server answering every n-th generation with HTTP 503 (n: the param)."""
    proc = subprocess.Popen([sys.executable, "-m", "appliance.bench.paced", "0.005", "0.001",
                             str(request.param)], stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(10)


def _run_against(*deployments: Deployment, levels: list[int], num_prompts: int) -> BenchmarkRun:
    with mock.patch.object(tasks, "benchmark_run_later"):
        run = services.benchmark_create(deployment_ids=[d.pk for d in deployments], config={
            "levels": levels, "num_prompts": num_prompts, "input_len": 8, "output_len": 8,
            "prompt_source": "synthetic", "mode": "back_to_back", "warmup": 0, "seed": 0,
            "request_rate": None})
    services.benchmark_run(run_id=run.pk)
    return BenchmarkRun.objects.get(pk=run.pk)


def test_a_run_against_an_engine_no_name_resolves_to_fails_naming_it(operator) -> None:  # type: ignore[no-untyped-def]
    # What the worker saw under compose before it joined the engine network.
    lost = _ready("lost", "http://appliance-engine-nowhere.invalid:30000")
    run = _run_against(lost, levels=[1, 4], num_prompts=4)
    assert run.status == BenchmarkStatus.FAILED
    assert run.error.startswith(f"cannot reach lost#{lost.pk} at "
                                "http://appliance-engine-nowhere.invalid:30000: ")
    assert "ClientConnector" in run.error and "Traceback" not in run.error
    body = _client(operator).get(f"/api/benchmarks/{run.pk}/").json()
    assert body["status"] == "failed" and body["error"] == run.error


@pytest.mark.parametrize("failing_server", [1], indirect=True)
def test_a_run_where_every_request_failed_is_failed_with_the_first_error(  # type: ignore[no-untyped-def]
        operator, failing_server, client) -> None:
    down = _ready("down", failing_server)
    run = _run_against(down, levels=[1, 2], num_prompts=3)
    assert run.status == BenchmarkStatus.FAILED
    assert run.error == (f"every request failed; the first: down#{down.pk}, concurrency 1: "
                         "HTTP 503: simulated overload")
    assert run.failed_requests == 6
    assert [(m["completed"], m["errors"]) for m in run.results["levels"]] == [(0, 3), (0, 3)]
    body = _client(operator).get(f"/api/benchmarks/{run.pk}/").json()
    assert body["status"] == "failed" and body["error"] == run.error
    assert body["failed_requests"] == 6
    client.force_login(operator)
    page = client.get(f"/benchmarks/{run.pk}/").content.decode()
    assert '<p id="bench-error" class="flash error">every request failed; the first: ' in page
    assert "6 failed requests" in client.get("/benchmarks/").content.decode()


@pytest.mark.parametrize("failing_server", [2], indirect=True)
def test_a_run_with_some_failed_requests_is_done_and_counts_them_per_level(  # type: ignore[no-untyped-def]
        operator, failing_server, client) -> None:
    flaky = _ready("flaky", failing_server)
    run = _run_against(flaky, levels=[1, 2], num_prompts=4)
    assert run.status == BenchmarkStatus.DONE and run.error == ""
    levels = run.results["levels"]
    assert [(m["completed"], m["errors"]) for m in levels] == [(2, 2), (2, 2)]
    assert all(m["first_error"] == "HTTP 503: simulated overload" for m in levels)
    assert run.failed_requests == 4 and all(m["output_throughput"] > 0 for m in levels)
    client.force_login(operator)
    page = client.get(f"/benchmarks/{run.pk}/").content.decode()
    assert '<p id="bench-warning" class="flash warning">4 requests failed;' in page
    assert "4 failed requests" in client.get("/benchmarks/").content.decode()


def _replicas(name: str, urls: tuple[str, ...]) -> Deployment:
    """Replica 0 and its replica rows (made with the ORM, as the shared plan allows)."""
    first = _ready(name, urls[0])
    for i, url in enumerate(urls[1:], start=1):
        Deployment.objects.create(name=name, spec=spec(name=name), recipe="r",
                                  algorithm="DDTREE", status=DeploymentStatus.READY,
                                  engine_url=url, image="img:1", replica_of=first,
                                  replica_index=i)
    return first


def _gateway_run(operator, settings, tmp_path, **body: Any) -> BenchmarkRun:  # type: ignore[no-untyped-def]
    """A run made through the API (6 prompts of 16 tokens each level) and run to its end
    here, its gateway a live panel server; the run as stored."""
    from tests.servers import panel_server

    with panel_server(tmp_path / "web.log") as gateway:
        settings.GATEWAY_URL = gateway
        with mock.patch.object(tasks, "benchmark_run_later"):  # run here, not by a worker
            r = _client(operator).post("/api/benchmarks/", {
                "num_prompts": 6, "input_len": 16, "output_len": 16, **body}, format="json")
        assert r.status_code == 201, r.content
        run_id = r.json()["id"]
        assert services.benchmark_run(run_id=run_id) == "done"
    return BenchmarkRun.objects.get(pk=run_id)


def test_a_run_replica_by_replica_goes_through_the_gateway_and_sums_the_replicas(operator, paced_pair, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from web.gateway.models import ApiKey, ApiKeyUsage

    fleet = _replicas("fleet", paced_pair)
    run = _gateway_run(operator, settings, tmp_path, deployments=[fleet.pk],
                       per_replica=True, levels=[1, 2])
    run_id = run.pk
    names = [t["name"] for t in run.targets]
    assert names == [f"fleet#{fleet.pk} through the gateway", f"fleet#{fleet.pk} replica 0",
                     f"fleet#{fleet.pk} replica 1"]
    assert run.config["baseline"] == names[0] and run.failed_requests == 0
    assert all("secret" not in str(t) and "sk-sd-" not in str(t) for t in run.targets)
    levels = {(m["target"], m["concurrency"]): m for m in run.results["levels"]}
    assert len(levels) == 6 and all(m["completed"] == 6 for m in levels.values())
    summed = run.results["replica_sum"]
    # each replica alone at 1 and 2 clients: the deployment at 2 and 4
    assert [s["concurrency"] for s in summed] == [2, 4]
    for row in summed:
        c = row["concurrency"] // 2
        assert row["output_throughput"] == pytest.approx(
            levels[(names[1], c)]["output_throughput"] + levels[(names[2], c)]["output_throughput"])
        assert row["target"] == f"fleet#{fleet.pk} replicas summed"
    key = ApiKey.objects.get(name=f"benchmark #{run_id}")
    assert key.revoked_at is not None  # the run's own key, ended with it
    # the gateway's requests counted on the key: 2 levels x (6 + 1 warm-up)
    assert ApiKeyUsage.objects.get(key=key, deployment=fleet).requests == 14


def test_a_run_through_the_gateway_alone_calls_the_deployment_as_its_clients_do(operator, paced_pair, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from web.gateway.models import ApiKey, ApiKeyUsage

    fleet = _replicas("fleet", paced_pair)
    run = _gateway_run(operator, settings, tmp_path, deployments=[fleet.pk],
                       through_gateway=True, levels=[2])
    run_id = run.pk
    assert [t["name"] for t in run.targets] == [f"fleet#{fleet.pk} through the gateway"]
    assert run.config["through_gateway"] and run.failed_requests == 0
    assert [m["completed"] for m in run.results["levels"]] == [6]
    assert "replica_sum" not in run.results or not run.results["replica_sum"]
    key = ApiKey.objects.get(name=f"benchmark #{run_id}")
    assert key.revoked_at is not None
    assert ApiKeyUsage.objects.get(key=key, deployment=fleet).requests == 7  # 6 + a warm-up
    r = _client(operator).post("/api/benchmarks/", {
        "deployments": [fleet.pk, _ready("b", "http://127.0.0.1:9").pk],
        "through_gateway": True}, format="json")
    assert r.status_code == 400 and "one deployment" in r.json()["through_gateway"][0]


def test_a_run_replica_by_replica_takes_one_deployment_and_needs_the_gateway(operator, settings) -> None:  # type: ignore[no-untyped-def]
    a, b = _ready("a", "http://127.0.0.1:9"), _ready("b", "http://127.0.0.1:9")
    client = _client(operator)
    settings.GATEWAY_URL = ""
    r = client.post("/api/benchmarks/", {"deployments": [a.pk], "per_replica": True},
                    format="json")
    assert r.status_code == 400 and "APPLIANCE_GATEWAY_URL" in r.json()["per_replica"][0]
    settings.GATEWAY_URL = "http://web:8000"
    r = client.post("/api/benchmarks/", {"deployments": [a.pk, b.pk], "per_replica": True},
                    format="json")
    assert r.status_code == 400 and "one deployment" in r.json()["per_replica"][0]
