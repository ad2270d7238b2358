from __future__ import annotations

import threading

import pytest
from django.db import connection

from appliance.logs.catalogue import CATALOGUE, UncataloguedCause
from appliance.logs.cause import Diagnosis
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus, Event

pytestmark = pytest.mark.django_db
S = DeploymentStatus


def _create(**changes):  # type: ignore[no-untyped-def]
    return deploying.deployment_create(data=spec(**changes), confirm_warnings=True)


def test_it_stores_a_valid_spec_queued_with_its_first_events(operator):  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), user=operator, confirm_warnings=True)
    assert deployment.status == S.QUEUED
    assert deployment.algorithm == "DDTREE"
    assert deployment.created_by == operator
    kinds = list(deployment.events.values_list("kind", flat=True))
    assert kinds[0] == "status" and "preflight" in kinds
    assert [e.seq for e in deployment.events.all()] == list(range(1, len(kinds) + 1))


def test_it_rejects_an_unknown_engine_key_naming_the_field_and_a_suggestion():  # type: ignore[no-untyped-def]
    with pytest.raises(services.DeploymentInputError) as caught:
        _create(engine__tp_sise=8)
    fields = caught.value.errors
    assert any("tp_sise" in name for name in fields)
    assert "tp_size" in " ".join(sum(fields.values(), []))
    assert Deployment.objects.count() == 0


def test_it_blocks_a_ddtree_budget_below_one_by_preflight():  # type: ignore[no-untyped-def]
    with pytest.raises(services.DeploymentInputError) as caught:
        _create(engine__speculative_ddtree_budget=0)
    assert any(f.rule == "ddtree-budget" for f in caught.value.findings) or caught.value.errors
    assert Deployment.objects.count() == 0


def test_it_moves_status_only_along_its_edges():  # type: ignore[no-untyped-def]
    deployment = _create()
    pk = deployment.pk
    assert not services.deployment_mark_ready(deployment_id=pk)  # queued -> ready is no edge
    assert services.deployment_mark_starting(deployment_id=pk, image="img")
    assert not services.deployment_mark_starting(deployment_id=pk, image="img")  # second one loses
    assert services.deployment_mark_loading(deployment_id=pk)
    assert services.deployment_mark_capturing(deployment_id=pk)
    assert services.deployment_mark_ready(deployment_id=pk, engine_url="http://e:30000")
    deployment.refresh_from_db()
    assert deployment.status == S.READY and deployment.engine_url == "http://e:30000"
    phases = [e.payload["status"] for e in deployment.events.filter(kind="phase")]
    assert phases == ["starting", "loading", "capturing", "ready"]


def test_failed_carries_a_diagnosis_and_the_last_lines_and_ends_the_stream():  # type: ignore[no-untyped-def]
    pk = _create().pk
    services.deployment_mark_starting(deployment_id=pk, image="img")
    diagnosis = CATALOGUE["cuda-oom-capture"].worded(summary="OOM", fix="lower it")
    assert services.deployment_mark_failed(
        deployment_id=pk, diagnosis=diagnosis, last_lines=["a", "b"]
    )
    deployment = Deployment.objects.get(pk=pk)
    assert deployment.status == S.FAILED
    assert deployment.diagnosis["cause"] == "cuda-oom-capture"
    assert deployment.last_lines == ["a", "b"]
    assert deployment.events.order_by("-seq").first().kind == "end"  # type: ignore[union-attr]
    assert not services.deployment_mark_failed(deployment_id=pk, diagnosis=diagnosis, last_lines=[])


def test_failed_refuses_a_diagnosis_whose_cause_is_not_in_the_catalogue():  # type: ignore[no-untyped-def]
    pk = _create().pk
    services.deployment_mark_starting(deployment_id=pk, image="img")
    with pytest.raises(UncataloguedCause, match="'oom-load'"):
        services.deployment_mark_failed(
            deployment_id=pk, diagnosis=Diagnosis("oom-load", "OOM", "lower it"), last_lines=[])
    deployment = Deployment.objects.get(pk=pk)
    assert deployment.status == S.STARTING and deployment.diagnosis is None
    assert not deployment.events.filter(kind="diagnosis").exists()


def test_stopping_a_queued_deployment_stops_it_at_once():  # type: ignore[no-untyped-def]
    deployment = _create()
    stopped = services.deployment_stop(deployment_id=deployment.pk)
    assert stopped.status == S.STOPPED


def test_stopping_a_running_deployment_hands_it_to_the_agent():  # type: ignore[no-untyped-def]
    deployment = _create()
    services.deployment_mark_starting(deployment_id=deployment.pk, image="img")
    deployment.refresh_from_db()
    assert services.deployment_stop(deployment_id=deployment.pk).status == S.STOPPING


@pytest.mark.django_db(transaction=True)
def test_event_seq_stays_gap_free_under_concurrent_writers():  # type: ignore[no-untyped-def]
    pk = _create().pk
    start = Deployment.objects.get(pk=pk).last_seq

    def writer() -> None:
        for i in range(20):
            services.events_append(deployment_id=pk, events=[("log", {"text": str(i)})] * 3)
        connection.close()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seqs = list(Event.objects.filter(deployment_id=pk).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, start + 4 * 20 * 3 + 1))
