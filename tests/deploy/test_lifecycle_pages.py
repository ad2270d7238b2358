"""The lifecycle in the panel (lifecycle_views.py) without JavaScript, and in the REST API:
Stop asks first, Restart, Clone and Redeploy-with-the-fix fill the form, Delete asks first."""

from __future__ import annotations

import pytest
from django.test import Client

from appliance.logs.cause import Diagnosis
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = pytest.mark.django_db
S = DeploymentStatus
OOM = Diagnosis("cuda-oom-capture", "CUDA ran out of memory while capturing.",
                "Lower the CUDA-graph batch limit", {"bs": 64}, {"engine.cuda_graph_max_bs": 32})


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _ready(**changes) -> Deployment:  # type: ignore[no-untyped-def]
    d = deploying.deployment_create(data=spec(**changes), confirm_warnings=True)
    services.deployment_mark_starting(deployment_id=d.pk, image="img", start_token="t")
    services.deployment_mark_ready(deployment_id=d.pk)
    return Deployment.objects.get(pk=d.pk)


def _failed(**changes) -> Deployment:  # type: ignore[no-untyped-def]
    d = _ready(**changes)
    services.deployment_mark_failed(deployment_id=d.pk, diagnosis=OOM, last_lines=[])
    return Deployment.objects.get(pk=d.pk)


def test_stop_shows_a_confirm_page_naming_the_deployment_and_stops_only_when_confirmed(operator):  # type: ignore[no-untyped-def]
    deployment, client = _ready(), _client(operator)
    page = client.get(f"/deployments/{deployment.pk}/stop/")
    assert page.status_code == 200
    assert b"Stop kimi-ddtree" in page.content and b"takes minutes" in page.content
    assert client.post(f"/deployments/{deployment.pk}/stop/").status_code == 200  # no confirm
    assert Deployment.objects.get(pk=deployment.pk).status == S.READY
    client.post(f"/deployments/{deployment.pk}/stop/", {"confirm": "yes"})
    assert Deployment.objects.get(pk=deployment.pk).status == S.STOPPING


def test_a_failed_deployment_offers_restart_clone_redeploy_and_delete(operator):  # type: ignore[no-untyped-def]
    deployment = _failed()
    page = _client(operator).get(f"/deployments/{deployment.pk}/").content.decode()
    for action in ('id="restart"', 'id="clone"', 'id="redeploy-fix"', 'id="delete"'):
        assert action in page
    assert 'id="stop" href' in page and 'data-when="active" hidden' in page


def test_restart_from_the_panel_queues_run_two_and_refuses_a_ready_one(operator):  # type: ignore[no-untyped-def]
    failed, client = _failed(), _client(operator)
    answer = client.post(f"/deployments/{failed.pk}/restart/", follow=True)
    assert b"run 2 queued" in answer.content
    assert Deployment.objects.get(pk=failed.pk).status == S.QUEUED
    ready = _ready(name="other", gpus=[1])
    answer = client.post(f"/deployments/{ready.pk}/restart/", follow=True)
    assert b"Restart refused" in answer.content and b"Stop it first" in answer.content


def test_clone_fills_the_form_with_the_spec_and_deploying_it_gives_the_same_spec(operator):  # type: ignore[no-untyped-def]
    source = _failed(engine__mem_fraction_static=0.8, restart={"policy": "on-failure",
                                                               "max_restarts": 3})
    services.deployment_stop(deployment_id=source.pk)
    client = _client(operator)
    form = client.get(f"/deployments/new/?from={source.pk}").context["form"]
    assert form.initial["model_path"] == "/models/Kimi-K2.6"
    assert "--mem-fraction-static 0.8" in form.initial["extra_args"]
    assert "on-failure" in form.initial["more_spec"]
    post = {k: v for k, v in form.initial.items() if v is not None and v is not False}
    answer = client.post("/deployments/new/", {**post, "name": "copy", "confirm_warnings": "on"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    copy = Deployment.objects.get(name="copy")
    assert copy.spec["engine"]["mem_fraction_static"] == 0.8
    assert copy.spec["restart"] == {"policy": "on-failure", "max_restarts": 3}
    assert copy.spec["engine"] == source.spec["engine"] and copy.gpus == source.gpus


def test_redeploy_with_the_fix_applies_the_patch_and_marks_the_changed_field(operator):  # type: ignore[no-untyped-def]
    failed = _failed()
    page = _client(operator).get(f"/deployments/new/?from={failed.pk}&fix=1")
    assert "--cuda-graph-max-bs 32" in page.context["form"].initial["extra_args"]
    html = page.content.decode()
    assert "engine.cuda_graph_max_bs: 32" in html and 'patched" id="field-extra_args"' in html


def test_delete_asks_first_then_removes_the_deployment(operator, viewer):  # type: ignore[no-untyped-def]
    failed, client = _failed(), _client(operator)
    assert b"cannot be undone" in client.get(f"/deployments/{failed.pk}/delete/").content
    assert _client(viewer).post(f"/deployments/{failed.pk}/delete/",
                                {"confirm": "yes"}).status_code == 403
    client.post(f"/deployments/{failed.pk}/delete/", {"confirm": "yes"})
    assert not Deployment.objects.filter(pk=failed.pk).exists()


def test_the_api_restarts_clones_with_the_fix_lists_runs_and_deletes(operator, token_for):  # type: ignore[no-untyped-def]
    failed = _failed()
    api = Client(HTTP_AUTHORIZATION=f"Token {token_for(operator)}")
    base = f"/api/deployments/{failed.pk}"
    clone = api.get(f"{base}/clone/?fix=true").json()
    assert clone["patch"] == {"engine.cuda_graph_max_bs": 32}
    assert clone["spec"]["engine"]["cuda_graph_max_bs"] == 32
    restarted = api.post(f"{base}/restart/")
    assert restarted.status_code == 202 and restarted.json()["run"] == 2
    again = api.post(f"{base}/restart/")
    assert again.status_code == 400 and "Stop it first" in again.json()["status"][0]
    runs = api.get(f"{base}/runs/").json()["results"]
    assert [r["number"] for r in runs] == [1, 2]
    run_one = api.get(f"{base}/events/?run=1").json()["results"]
    assert run_one and all(e["seq"] <= runs[0]["last_seq"] for e in run_one)
    assert api.delete(f"{base}/").status_code == 400  # queued: stop it first
    api.post(f"{base}/stop/")
    assert api.delete(f"{base}/").status_code == 204
    assert not Deployment.objects.filter(pk=failed.pk).exists()


def test_a_stop_during_a_build_is_ended_by_the_build_worker_only_before_any_engine() -> None:
    """Stop on a building deployment: the build worker whose build it cancelled marks it
    stopped (no agent was handed a start to stop or report); a stopping run whose engine
    started (a start token) is left to its host's agent."""
    building = deploying.deployment_create(data=spec(), confirm_warnings=True)
    services.deployment_mark_building(deployment_id=building.pk)
    services.deployment_stop(deployment_id=building.pk)
    assert Deployment.objects.get(pk=building.pk).status == S.STOPPING
    assert services.deployment_mark_build_stopped(deployment_id=building.pk)
    row = Deployment.objects.get(pk=building.pk)
    assert row.status == S.STOPPED and row.ended_at is not None
    assert row.events.filter(kind="end", payload__status="stopped").exists()

    started = _ready(name="started")
    services.deployment_stop(deployment_id=started.pk)
    assert not services.deployment_mark_build_stopped(deployment_id=started.pk)
    assert Deployment.objects.get(pk=started.pk).status == S.STOPPING
