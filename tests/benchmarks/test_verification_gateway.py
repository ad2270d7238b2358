"""The losslessness check through the gateway, through the real parts: the check created
through the REST API goes through Redis to a Celery worker process, which calls the panel's
/v1 (uvicorn, APPLIANCE_GATEWAY_URL) with a key it makes for the check; the two ready
deployments' engines are stand-in OpenAI servers that are not SGLang
(tests/openai_standin.py). The divergence is found at its token; the key is the
caller's, scoped to the two, revoked after, and its secret is nowhere the API shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from rest_framework.test import APIClient

from tests.benchmarks.pair import wait_until
from tests.openai_standin import GAP, standin
from tests.servers import celery_worker, panel_server
from tests.specs import spec
from web.benchmarks.models import VerificationRun
from web.deployments.models import Deployment, DeploymentStatus
from web.gateway.models import ApiKey, ApiKeyUsage

pytestmark = pytest.mark.django_db(transaction=True)
PROMPTS = "".join(json.dumps({"prompt": p}) + "\n" for p in ("The quick brown fox", "1, 1, 2,"))


def _deployment(name: str, url: str, algorithm: str) -> Deployment:
    data = spec(name=name)  # no served_model_name: the gateway routes by the name
    if algorithm == "NONE":
        data["engine"] = {"model_path": data["engine"]["model_path"], "tp_size": 1}
    return Deployment.objects.create(name=name, spec=data, recipe=data["recipe"],
                                     algorithm=algorithm, gpus=data["gpus"],
                                     status=DeploymentStatus.READY, engine_url=url)


@pytest.fixture
def stack(tmp_path: Path, settings: Any) -> Iterator[dict[str, Any]]:
    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # no stale tasks of other tests
    with ExitStack() as stack:
        panel = stack.enter_context(panel_server(tmp_path / "uvicorn.log"))
        stack.enter_context(celery_worker(tmp_path / "worker.log",
                                          APPLIANCE_GATEWAY_URL=panel))
        settings.GATEWAY_URL = panel
        a = stack.enter_context(standin(model="spec-gw", diverge_at=6, logprobs=False))
        b = stack.enter_context(standin(model="base-gw"))
        yield {"panel": panel, "a": a, "b": b,
               "candidate": _deployment("spec-gw", a.url, "DDTREE"),
               "baseline": _deployment("base-gw", b.url, "NONE")}


def test_a_check_through_the_gateway_finds_the_divergence_with_a_key_of_its_own(
        operator: Any, stack: dict[str, Any]) -> None:
    client = APIClient()
    client.force_authenticate(operator)
    made = client.post("/api/verifications/", {
        "candidate": stack["candidate"].pk, "baseline": stack["baseline"].pk,
        "route": "gateway", "prompt_source": "jsonl", "prompts": PROMPTS, "max_tokens": 10},
        format="json")
    assert made.status_code == 201, made.content
    run = wait_until(lambda: VerificationRun.objects.filter(
        pk=made.json()["id"], status__in=["done", "failed"]).first(), 60, "check finished")
    assert run.status == "done", run.error
    results = run.results
    assert (results["api"], results["models"]) == ("completions",
                                                  {"a": "spec-gw", "b": "base-gw"})
    assert results["a"] == results["b"] == stack["panel"]  # the gateway, not the engines
    assert [(p["verdict"], p["position"], p["gap"]) for p in results["prompts"]] == [
        ("failure", 6, GAP)] * 2
    assert "does not support return_logprob" in results["a_logprobs"]
    # The key: the caller's, named for the check, scoped to the two, revoked, and used.
    key = ApiKey.objects.get(name=f"losslessness check #{run.pk}")
    assert key.owner == operator and key.revoked_at is not None and not key.all_deployments
    assert set(key.deployments.all()) == {stack["candidate"], stack["baseline"]}
    # Two prompts each; the candidate's log-prob ask is refused by the gateway itself (a
    # DDTREE engine cannot return log-probs, by the recordings), so it costs no usage.
    assert {u.deployment.name: u.requests for u in ApiKeyUsage.objects.filter(key=key)} == {
        "spec-gw": 2, "base-gw": 2}
    # No secret of a key (sk-sd-...) anywhere the check's row or its API answer shows.
    answer = client.get(f"/api/verifications/{run.pk}/")
    assert answer.status_code == 200 and "sk-sd-" not in answer.content.decode()
    assert "sk-sd-" not in json.dumps(run.results) + run.error + json.dumps(run.progress)


def test_the_gateway_route_is_refused_by_name_when_the_gateway_url_is_not_set(
        operator: Any, settings: Any) -> None:
    settings.GATEWAY_URL = ""
    a = _deployment("spec-x", "http://127.0.0.1:9", "DDTREE")
    b = _deployment("base-x", "http://127.0.0.1:9", "NONE")
    client = APIClient()
    client.force_authenticate(operator)
    refused = client.post("/api/verifications/", {"candidate": a.pk, "baseline": b.pk,
                                                  "route": "gateway"}, format="json")
    assert refused.status_code == 400
    assert "APPLIANCE_GATEWAY_URL" in refused.json()["route"][0]
    assert not VerificationRun.objects.exists()
    assert settings.GATEWAY_URL == ""
