"""Lifecycle services (services/deployments.py, services/lifecycle.py) on the real database:
Restart keeps the row and its earlier runs, Delete takes the log with it, the restart policy
restarts only an engine that died while serving, with a doubling wait and a count."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from appliance.logs.appliance_causes import ENGINE_EXITED
from appliance.logs.cause import Diagnosis
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import selectors, services
from web.deployments.models import Deployment, DeploymentStatus, Event, MetricPoint, Run
from web.deployments.services import lifecycle
from web.fleet.models import GpuLease

pytestmark = pytest.mark.django_db
S = DeploymentStatus
ON_FAILURE = {"policy": "on-failure", "max_restarts": 2}
DIED = ENGINE_EXITED.worded(summary="the engine exited")


def _create(**changes):  # type: ignore[no-untyped-def]
    return deploying.deployment_create(data=spec(**changes), confirm_warnings=True)


def _ready(deployment: Deployment, token: str = "t1") -> Deployment:
    pk = deployment.pk
    assert services.deployment_mark_starting(deployment_id=pk, image="img", start_token=token)
    assert services.deployment_mark_ready(deployment_id=pk, engine_url="http://e:30000")
    return Deployment.objects.get(pk=pk)


def _failed(deployment: Deployment) -> Deployment:
    _ready(deployment)
    diagnosis = Diagnosis("cuda-oom-capture", "OOM", "lower it", {"bs": 64},
                          {"engine.cuda_graph_max_bs": 32})
    assert services.deployment_mark_failed(deployment_id=deployment.pk, diagnosis=diagnosis,
                                           last_lines=["Traceback"])
    return Deployment.objects.get(pk=deployment.pk)


def test_a_restart_keeps_the_row_and_spec_and_starts_run_two_after_the_kept_events(operator):  # type: ignore[no-untyped-def]
    failed = _failed(_create())
    events_before = failed.last_seq
    restarted = services.deployment_restart(deployment_id=failed.pk, user=operator)
    assert restarted.pk == failed.pk and restarted.spec == failed.spec
    assert restarted.status == S.QUEUED and restarted.run == 2
    assert restarted.diagnosis is None and restarted.start_token == "" and restarted.ended_at is None
    assert Event.objects.filter(deployment=failed, seq__lte=events_before).count() == events_before
    runs = selectors.deployment_runs(deployment=restarted)
    assert [(r["number"], r["reason"], r["outcome"]) for r in runs] == [
        (1, "deploy", "failed"), (2, "restart", "queued")]
    assert runs[0]["first_seq"] == 1 and runs[0]["last_seq"] == events_before
    assert runs[0]["diagnosis"]["cause"] == "cuda-oom-capture"
    assert runs[1]["first_seq"] == events_before + 1 and runs[1]["started_by"] == "otto"
    marker = Event.objects.get(deployment=failed, seq=events_before + 1)
    assert marker.payload["run"] == 2 and "restarted by otto" in marker.payload["message"]
    assert set(GpuLease.objects.filter(deployment=failed).values_list("gpu_index", flat=True)) \
        == set(failed.gpus)


def test_it_refuses_to_restart_an_active_deployment_naming_its_status():  # type: ignore[no-untyped-def]
    ready = _ready(_create())
    with pytest.raises(services.DeploymentInputError) as caught:
        services.deployment_restart(deployment_id=ready.pk)
    assert "ready" in caught.value.errors["status"][0]
    assert Deployment.objects.get(pk=ready.pk).run == 1


def test_it_refuses_a_restart_when_another_deployment_now_holds_its_gpu():  # type: ignore[no-untyped-def]
    first = _create()
    services.deployment_stop(deployment_id=first.pk)  # queued: stopped at once, GPU 0 free
    other = _create(name="other")
    with pytest.raises(services.DeploymentInputError) as caught:
        services.deployment_restart(deployment_id=first.pk)
    assert f"#{other.pk}" in caught.value.errors["gpus"][0]
    first.refresh_from_db()
    assert first.status == S.STOPPED and first.run == 1  # nothing changed
    assert not Run.objects.filter(deployment=first, number=2).exists()


def test_delete_takes_a_stopped_deployment_with_its_events_runs_and_series():  # type: ignore[no-untyped-def]
    failed = _failed(_create())
    MetricPoint.objects.create(deployment_id=failed.pk, ts=timezone.now(), resolution_s=2,
                               throughput=1.0)
    services.deployment_restart(deployment_id=failed.pk)
    services.deployment_stop(deployment_id=failed.pk)
    services.deployment_delete(deployment_id=failed.pk)
    assert not Deployment.objects.filter(pk=failed.pk).exists()
    assert not Event.objects.filter(deployment_id=failed.pk).exists()
    assert not Run.objects.filter(deployment_id=failed.pk).exists()
    assert not MetricPoint.objects.filter(deployment_id=failed.pk).exists()


def test_it_refuses_to_delete_a_running_deployment():  # type: ignore[no-untyped-def]
    ready = _ready(_create())
    with pytest.raises(services.DeploymentInputError) as caught:
        services.deployment_delete(deployment_id=ready.pk)
    assert "Stop it first" in caught.value.errors["status"][0]
    assert Deployment.objects.filter(pk=ready.pk).exists()


def test_the_policy_restarts_an_engine_that_died_while_serving_after_a_doubling_wait(settings):  # type: ignore[no-untyped-def]
    settings.RESTART_BACKOFF_S, settings.RESTART_BACKOFF_MAX_S = 10, 300
    deployment = _ready(_create(restart=ON_FAILURE))
    before = timezone.now()
    assert lifecycle.deployment_restart_after_death(
        deployment_id=deployment.pk, start_token="t1", diagnosis=DIED, message="it died")
    deployment.refresh_from_db()
    assert deployment.status == S.STARTING and deployment.run == 2 and deployment.restarts == 1
    assert deployment.start_token not in ("", "t1")
    wait = (deployment.restart_not_before - before).total_seconds()
    assert 9 < wait < 11
    marker = deployment.events.order_by("-seq").first()
    assert marker is not None and "restart 1 of 2 in 10 s" in marker.payload["message"]

    # Ready again, dies again: 20 s this time; then the policy is used up.
    assert services.deployment_mark_ready(deployment_id=deployment.pk)
    before = timezone.now()
    assert lifecycle.deployment_restart_after_death(
        deployment_id=deployment.pk, start_token=deployment.start_token, diagnosis=DIED,
        message="it died")
    deployment.refresh_from_db()
    assert deployment.restarts == 2 and deployment.run == 3
    assert 19 < (deployment.restart_not_before - before).total_seconds() < 21
    assert services.deployment_mark_ready(deployment_id=deployment.pk)
    assert not lifecycle.deployment_restart_after_death(
        deployment_id=deployment.pk, start_token=deployment.start_token, diagnosis=DIED,
        message="it died")
    deployment.refresh_from_db()
    assert [r["outcome"] for r in selectors.deployment_runs(deployment=deployment)] == [
        "died", "died", "ready"]


def test_the_policy_never_restarts_without_opting_in_or_an_engine_that_was_not_ready():  # type: ignore[no-untyped-def]
    plain = _ready(_create())
    assert not lifecycle.deployment_restart_after_death(
        deployment_id=plain.pk, start_token="t1", diagnosis=DIED, message="it died")
    loading = _create(name="loading", gpus=[1], restart=ON_FAILURE)
    assert services.deployment_mark_starting(deployment_id=loading.pk, image="i", start_token="t")
    assert services.deployment_mark_loading(deployment_id=loading.pk)
    assert not lifecycle.deployment_restart_after_death(
        deployment_id=loading.pk, start_token="t", diagnosis=DIED, message="it died")
    # A stale follower (an earlier start's token) restarts nothing either.
    ready = _ready(_create(name="ready", gpus=[2], restart=ON_FAILURE), token="now")
    assert not lifecycle.deployment_restart_after_death(
        deployment_id=ready.pk, start_token="before", diagnosis=DIED, message="it died")
    assert Deployment.objects.get(pk=ready.pk).restarts == 0


def test_the_stop_warning_knows_how_long_the_last_start_took():  # type: ignore[no-untyped-def]
    deployment = _ready(_create())
    began = timezone.now() - timedelta(seconds=390)
    Deployment.objects.filter(pk=deployment.pk).update(status_times={
        "starting": began.isoformat(), "ready": (began + timedelta(seconds=390)).isoformat()})
    deployment.refresh_from_db()
    assert selectors.deployment_load_seconds(deployment=deployment) == pytest.approx(390, abs=1)
