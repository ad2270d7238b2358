"""The losslessness check as a user runs it, through the real parts: two test engine
deployments of the same model started by the engine agent (a process), a DDTREE one with
divergences planted by TEST_ENGINE_DIVERGE and a baseline without speculation; the check
created through the REST API goes through real Redis to a Celery worker process on the
bench queue, which writes progress and results to PostgreSQL. Each planted divergence is
found at its token with its class; the exports and the page carry them."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from tests.benchmarks.pair import (
    FIB,
    FOX,
    STACK_ENV,
    baseline_spec,
    speculative_spec,
    wait_until,
)
from tests.conftest_docker import remove_engines
from tests.servers import celery_worker, own_host_agent, panel_server
from web.benchmarks.models import VerificationRun
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


@contextlib.contextmanager
def _worker_and_agent(tmp_path: Path, image: str) -> Iterator[None]:
    env = {**STACK_ENV, "APPLIANCE_ENGINE_IMAGE": image}
    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # no stale tasks of other tests
    mine = instance_id()
    try:
        with panel_server(tmp_path / "web.log", **env) as url, \
                celery_worker(tmp_path / "worker.log", **env), \
                own_host_agent(tmp_path / "agent.log", url, tmp_path, **env):
            yield
    finally:
        remove_engines(mine)


@pytest.fixture
def pair(tmp_path: Path, test_engine_image: str, settings) -> Iterator[tuple[int, int]]:  # type: ignore[no-untyped-def]
    settings.ENGINE_GPU_REQUESTS = False  # as the worker and agent processes run
    with _worker_and_agent(tmp_path, test_engine_image):
        spec_pk = deploying.deployment_create(data=speculative_spec(), confirm_warnings=True).pk
        base_pk = deploying.deployment_create(data=baseline_spec(), confirm_warnings=True).pk
        wait_until(lambda: Deployment.objects.filter(pk__in=[spec_pk, base_pk],
                                                status=DeploymentStatus.READY).count() == 2,
              120, f"both ready: {list(Deployment.objects.values_list('name', 'status'))}")
        yield spec_pk, base_pk


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _finished(run_id: int) -> VerificationRun:
    return wait_until(lambda: VerificationRun.objects.filter(
        pk=run_id, status__in=["done", "failed", "cancelled"]).first(), 90,
        f"check {run_id} finished")


def test_the_check_finds_each_planted_divergence_at_its_token_with_its_class(
        operator, pair) -> None:  # type: ignore[no-untyped-def]
    spec_pk, base_pk = pair
    client = _api(operator)
    r = client.post("/api/verifications/", {"candidate": spec_pk, "baseline": base_pk,
                                            "max_tokens": 24, "name": "planted"}, format="json")
    assert r.status_code == 201, r.content
    run = _finished(r.json()["id"])
    assert (run.status, run.error) == ("done", "")
    body = client.get(f"/api/verifications/{run.pk}/").json()
    results = body["results"]
    assert (results["total"], results["identical"], results["near_ties"],
            results["failures"], results["passed"]) == (36, 34, 1, 1, False)
    assert results["match_rate"] == pytest.approx(34 / 36)
    # " (simulator)" follows each name where this machine's agent reports the test engine.
    assert results["candidate"].removesuffix(" (simulator)") == f"spec#{spec_pk}"
    assert results["baseline"].removesuffix(" (simulator)") == f"base#{base_pk}"
    assert "does not support return_logprob" in results["a_logprobs"]  # B's gaps judged
    prompts = {p["prompt"]: p for p in results["prompts"]}
    fib, fox = prompts[FIB], prompts[FOX]
    assert (fib["verdict"], fib["position"], fib["candidate_in_top2"]) == ("failure", 5, True)
    assert fib["gap"] >= 1.5 and fib["candidate_gap"] == fib["gap"]  # B's second choice
    assert (fox["verdict"], fox["position"], fox["gap"]) == ("near-tie", 12, 0.0625)
    for p in (fib, fox):  # both continuations side by side, from the divergent token
        assert p["a"]["ids"][0] != p["b"]["ids"][0]
        assert p["a"]["text"].startswith(p["a"]["token_text"])
        assert p["b"]["text"].startswith(p["b"]["token_text"])
    assert all(p["verdict"] == "identical" and p["position"] is None
               for p in prompts.values() if p not in (fib, fox))
    progress = body["progress"]
    assert (progress["done"], progress["total"], progress["failures"]) == (36, 36, 1)

    rows = list(csv.DictReader(io.StringIO(
        client.get(f"/api/verifications/{run.pk}/export.csv/").content.decode())))
    assert len(rows) == 36
    fib_row = next(row for row in rows if row["prompt"] == FIB)
    assert (fib_row["verdict"], fib_row["position"]) == ("failure", "5")
    assert float(fib_row["candidate_gap"]) == fib["gap"]
    assert json.loads(fib_row["candidate_ids"]) == fib["a"]["ids"]
    exported = client.get(f"/api/verifications/{run.pk}/export.json/")
    assert exported.json()["results"] == results
    assert 'filename="verification-' in exported["Content-Disposition"]

    page = Client()
    page.force_login(operator)
    listing = page.get("/benchmarks/verifications/").content.decode()
    assert "34/36 identical, 1 near-tie, <span class=\"finding-error\">1 failure</span>" in listing


def test_a_lower_threshold_makes_the_near_tie_a_failure_and_an_upload_chooses_prompts(
        operator, pair) -> None:  # type: ignore[no-untyped-def]
    spec_pk, base_pk = pair
    prompts = json.dumps({"prompt": FOX}) + "\n" + json.dumps({"prompt": "unplanted"}) + "\n"
    r = _api(operator).post("/api/verifications/", {
        "candidate": spec_pk, "baseline": base_pk, "max_tokens": 16, "threshold": 0.01,
        "prompt_source": "jsonl", "prompts": prompts}, format="json")
    assert r.status_code == 201, r.content
    run = _finished(r.json()["id"])
    assert run.status == "done"
    verdicts = [(p["verdict"], p["position"]) for p in run.results["prompts"]]
    assert verdicts == [("failure", 12), ("identical", None)]
    assert run.results["threshold"] == 0.01 and run.results["failures"] == 1


def test_a_check_whose_baseline_does_not_answer_fails_naming_it(operator, pair) -> None:  # type: ignore[no-untyped-def]
    spec_pk, _ = pair
    # A row that says ready at an address nobody answers at (an engine gone since), placed
    # on no host this test runs an agent for: an agent that took it would find no engine
    # and mark the row failed, which may come before the POST on a slow machine.
    gone = Deployment.objects.create(
        name="gone", spec=baseline_spec(), recipe="kimi-k2.6-baseline", algorithm="NONE",
        status=DeploymentStatus.READY, engine_url="http://127.0.0.1:9", image="img:1",
        agent_id="an-agent-elsewhere")
    r = _api(operator).post("/api/verifications/", {"candidate": spec_pk, "baseline": gone.pk},
                            format="json")
    assert r.status_code == 201, r.content
    run = _finished(r.json()["id"])
    assert run.status == "failed"
    assert f"gone#{gone.pk} (http://127.0.0.1:9) is unreachable" in run.error
    assert "Traceback" not in run.error


def test_a_running_check_cancelled_stops_before_its_next_prompt_keeping_those_judged(
        operator, pair) -> None:  # type: ignore[no-untyped-def]
    spec_pk, base_pk = pair
    client = _api(operator)
    # 4096 tokens an answer: seconds per prompt on the test engines, time to cancel.
    r = client.post("/api/verifications/", {"candidate": spec_pk, "baseline": base_pk,
                                            "max_tokens": 4096}, format="json")
    assert r.status_code == 201, r.content
    run_id = r.json()["id"]
    wait_until(lambda: VerificationRun.objects.filter(
        pk=run_id, progress__done__gte=1).exists(), 60, "one prompt judged")
    assert client.post(f"/api/verifications/{run_id}/cancel/").json()["status"] == "cancelling"
    run = _finished(run_id)
    assert run.status == "cancelled" and run.results == {}
    judged = run.progress["prompts"]
    assert 1 <= run.progress["done"] == len(judged) < 36
    assert judged[0]["prompt"] == FOX and judged[0]["verdict"] == "near-tie"
