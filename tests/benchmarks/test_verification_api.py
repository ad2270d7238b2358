"""The losslessness check's REST API and pages without engines: a check is refused with a
400 naming the field (candidate or baseline not ready, not speculative, with speculation,
of another target model; a bad prompt file; a threshold out of range), nothing is stored
then; a viewer reads but cannot run; the form names its fields and the threshold's reason;
the schema lists every endpoint. Runs against real engines: tests/benchmarks."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.specs import spec
from web import tasks
from web.benchmarks import verification_services as services
from web.benchmarks.models import BenchmarkStatus, VerificationRun
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _deployment(name: str, *, algorithm: str = "DDTREE", model: str = "/models/Kimi-K2.6",
                status: str = DeploymentStatus.READY) -> Deployment:
    return Deployment.objects.create(
        name=name, spec=spec(name=name, engine__model_path=model,
                             engine__speculative_algorithm=algorithm),
        recipe="r", algorithm=algorithm, status=status, engine_url="http://127.0.0.1:9",
        image="img:1")


@pytest.fixture
def pair() -> tuple[Deployment, Deployment]:
    return _deployment("spec"), _deployment("base", algorithm="NONE")


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _create(user: Any, **body: Any) -> Any:
    with mock.patch.object(tasks, "verification_run_later") as enqueue:
        response = _api(user).post("/api/verifications/", body, format="json")
    response.enqueued = enqueue.call_args_list  # type: ignore[attr-defined]
    return response


def test_a_check_of_a_speculative_deployment_against_its_baseline_is_queued(
        operator, pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    r = _create(operator, candidate=a.pk, baseline=b.pk)
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "queued" and (body["candidate"], body["baseline"]) == (a.pk, b.pk)
    assert body["config"] == {"max_tokens": 64, "threshold": 0.5, "prompt_source": "builtin",
                              "route": "direct"}
    assert body["progress"] == {"done": 0, "total": 36}
    assert body["targets"]["candidate"]["model"] == "/models/Kimi-K2.6"
    assert r.enqueued == [mock.call(body["id"])]


@pytest.mark.parametrize(("change", "field", "says"), [
    ({"candidate": "other-model"}, "baseline", "choose a baseline of the same target model"),
    ({"baseline": "speculative"}, "baseline", "choose one without speculation"),
    ({"candidate": "plain"}, "candidate", "runs no speculative algorithm"),
    ({"candidate": "loading"}, "candidate", "is loading, not ready"),
    ({"baseline": "missing"}, "baseline", "no deployment"),
    ({"baseline": "same"}, "baseline", "other than the candidate"),
])
def test_a_pair_that_cannot_be_checked_is_a_400_naming_the_field(
        operator, pair, change: dict[str, str], field: str, says: str) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    made = {
        "other-model": lambda: _deployment("spec2", model="/models/Other"),
        "speculative": lambda: _deployment("spec3"),
        "plain": lambda: _deployment("base2", algorithm="NONE"),
        "loading": lambda: _deployment("spec4", status=DeploymentStatus.LOADING),
    }
    ids = {"candidate": a.pk, "baseline": b.pk}
    for role, what in change.items():
        ids[role] = (a.pk if what == "same" else 10**6 if what == "missing"
                     else made[what]().pk)
    r = _create(operator, **ids)
    assert r.status_code == 400, r.content
    assert list(r.json()) == [field] and says in r.json()[field][0]
    assert not VerificationRun.objects.exists() and r.enqueued == []


def test_bad_prompts_and_numbers_are_400s_naming_the_field(operator, pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    ids = {"candidate": a.pk, "baseline": b.pk}
    r = _create(operator, **ids, prompt_source="jsonl", prompts='{"text": "no prompt key"}')
    assert r.status_code == 400 and 'line 1 has no "prompt" string' in r.json()["prompts"][0]
    r = _create(operator, **ids, prompt_source="jsonl", prompts="")
    assert r.status_code == 400 and "holds 0 prompts" in r.json()["prompts"][0]
    r = _create(operator, **ids, threshold=-1)
    assert r.status_code == 400 and list(r.json()) == ["threshold"]
    r = _create(operator, **ids, max_tokens=0)
    assert r.status_code == 400 and list(r.json()) == ["max_tokens"]
    r = _create(operator, candidate=2**70, baseline=b.pk)  # past the id column: no 500
    assert r.status_code == 400 and list(r.json()) == ["candidate"]
    r = _create(operator, **ids, threshold="nan")
    assert r.status_code == 400 and list(r.json()) == ["threshold"]
    r = _create(operator, **ids, prompt_source="sharegpt")
    assert r.status_code == 400 and list(r.json()) == ["prompt_source"]
    assert not VerificationRun.objects.exists()


def test_an_uploaded_jsonl_chooses_the_prompts(operator, pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    r = _create(operator, candidate=a.pk, baseline=b.pk, prompt_source="jsonl",
                prompts='{"prompt": "one"}\n\n"two"\n', max_tokens=8, threshold=0.25)
    assert r.status_code == 201, r.content
    run = VerificationRun.objects.get()
    assert run.progress == {"done": 0, "total": 2}
    assert run.config == {"max_tokens": 8, "threshold": 0.25, "prompt_source": "jsonl",
                          "route": "direct"}


def test_a_viewer_reads_checks_but_cannot_start_or_cancel_one(viewer, operator, pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    run_id = _create(operator, candidate=a.pk, baseline=b.pk).json()["id"]
    client = _api(viewer)
    assert client.get("/api/verifications/").json()["results"][0]["id"] == run_id
    assert client.get(f"/api/verifications/{run_id}/").status_code == 200
    assert client.post("/api/verifications/", {"candidate": a.pk, "baseline": b.pk},
                       format="json").status_code == 403
    assert client.post(f"/api/verifications/{run_id}/cancel/").status_code == 403


def test_a_queued_check_cancels_at_once_and_its_task_then_does_nothing(operator, pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    run_id = _create(operator, candidate=a.pk, baseline=b.pk).json()["id"]
    r = _api(operator).post(f"/api/verifications/{run_id}/cancel/")
    assert r.status_code == 202 and r.json()["status"] == BenchmarkStatus.CANCELLED
    assert services.verification_run(run_id=run_id) == "not queued"


def test_the_form_names_its_fields_and_why_the_threshold(operator, pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    client = Client()
    client.force_login(operator)
    page = client.get("/benchmarks/verifications/new/").content.decode()
    assert f'<option value="{a.pk}">#{a.pk} spec (DDTREE, /models/Kimi-K2.6)</option>' in page
    assert f'<option value="{b.pk}">#{b.pk} base (/models/Kimi-K2.6)</option>' in page
    for label in ("Speculative deployment (A)", "Baseline without speculation (B)",
                  "Tokens per answer", "Near-tie threshold (B's top-2 log-prob gap)",
                  'id="run-verification">Run check', "built-in set (36 prompts)"):
        assert label in page
    assert "every divergence sat where the baseline&#x27;s top two log-probs were 0.125" in page
    other = _deployment("spec2", model="/models/Other")
    chosen = client.get(f"/benchmarks/verifications/new/?candidate={other.pk}").content.decode()
    assert f'<option value="{other.pk}" selected>#{other.pk} spec2' in chosen
    detail = client.get(f"/deployments/{other.pk}/").content.decode()
    assert f'href="/benchmarks/verifications/new/?candidate={other.pk}"' in detail
    assert 'id="check-losslessness"' not in client.get(f"/deployments/{b.pk}/").content.decode()
    with mock.patch.object(tasks, "verification_run_later"):
        r = client.post("/benchmarks/verifications/new/", {"candidate": other.pk,
                                                           "baseline": b.pk})
    assert r.status_code == 400
    assert '<li data-field="baseline">baseline: ' in r.content.decode()
    assert "choose a baseline of the same target model" in r.content.decode()
    with mock.patch.object(tasks, "verification_run_later"):
        r = client.post("/benchmarks/verifications/new/", {"candidate": a.pk, "baseline": b.pk,
                                                           "max_tokens": "16"})
    run = VerificationRun.objects.get()
    assert r.status_code == 302 and r["Location"] == f"/benchmarks/verifications/{run.pk}/"
    page = client.get(r["Location"]).content.decode()
    assert f"<h1>Losslessness check #{run.pk} </h1>" in page
    assert 'id="verify-table"' in page and f"/api/verifications/{run.pk}/export.csv/" in page
    assert f'id="verification-{run.pk}"' in client.get("/benchmarks/verifications/").content.decode()


def test_the_schema_lists_the_check_endpoints(operator) -> None:  # type: ignore[no-untyped-def]
    schema = _api(operator).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    paths = schema["paths"]
    for path in ("/api/verifications/", "/api/verifications/{id}/",
                 "/api/verifications/{id}/cancel/", "/api/verifications/{id}/export.csv/",
                 "/api/verifications/{id}/export.json/"):
        assert path in paths
    create = schema["components"]["schemas"]["VerificationCreate"]["properties"]
    assert create["threshold"]["default"] == 0.5 and create["max_tokens"]["default"] == 64
    assert set(create) >= {"candidate", "baseline", "prompt_source", "prompts"}
