"""Replicas: a spec with replicas: N is replica 0 and N-1 replica rows, made all or none;
Scale (API and panel) adds or stops rows; Stop, Restart and Delete of replica 0 take its
replicas; the served name counts them as one; the list and the page show them."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from appliance.logs.catalogue import CATALOGUE
from appliance.runtime import series
from tests.hostrows import host_reported
from tests.rows import queued
from tests.specs import spec
from web.deployments import services
from web.deployments.models import Deployment
from web.deployments.services.metrics import metrics_store_point
from web.fleet.models import GpuLease

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _group(first: Deployment) -> list[Deployment]:
    return [Deployment.objects.get(pk=first.pk),
            *Deployment.objects.filter(replica_of=first).order_by("replica_index")]


def _ready(pk: int, throughput: float | None = None) -> None:
    services.deployment_mark_starting(deployment_id=pk, image="img", start_token=f"t{pk}")
    services.deployment_mark_ready(deployment_id=pk)
    if throughput is not None:
        metrics_store_point(deployment_id=pk, resolution_s=2,
                            point=series.MetricPoint(t=time.time(), throughput=throughput))


def _statuses(first: Deployment) -> list[tuple[int, str]]:
    return [(r.replica_index, r.status) for r in _group(first)]


def test_the_api_creates_replica_zero_and_its_replicas_each_on_its_own_gpus(operator) -> None:  # type: ignore[no-untyped-def]
    answer = _client(operator).post("/api/deployments/", {
        "spec": spec(gpus=[0, 1], engine__tp_size=2, replicas=3), "confirm_warnings": True},
        content_type="application/json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["replica_of"], body["replica_index"], body["host"]) == (None, 0, "gpu-host")
    assert body["placement_reason"] == "gpu-host: 8 free GPUs, this panel's host"
    rows = _group(Deployment.objects.get(pk=body["id"]))
    assert [(r.replica_index, r.gpus, r.status) for r in rows] == [
        (0, [0, 1], "queued"), (1, [2, 3], "queued"), (2, [4, 5], "queued")]
    assert sorted(GpuLease.objects.values_list("gpu_index", flat=True)) == [0, 1, 2, 3, 4, 5]
    detail = _client(operator).get(f"/api/deployments/{rows[1].pk}/").json()
    assert (detail["replica_of"], detail["replica_index"], detail["gpus"]) == (
        body["id"], 1, [2, 3])


def test_replicas_that_do_not_fit_are_a_400_and_nothing_is_stored(operator, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 4
    answer = _client(operator).post("/api/deployments/", {
        "spec": spec(gpus=[0, 1], engine__tp_size=2, replicas=3), "confirm_warnings": True},
        content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["replicas"][0].startswith(
        "Replica 2 needs 2 free GPUs on one host: gpu-host has 0 free")
    assert not Deployment.objects.exists() and not GpuLease.objects.exists()


def test_scale_up_and_down_through_the_api_with_restarts_permission(operator, viewer) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0])
    url = f"/api/deployments/{first.pk}/scale/"
    assert _client(viewer).post(url, {"replicas": 3},
                                content_type="application/json").status_code == 403
    up = _client(operator).post(url, {"replicas": 3}, content_type="application/json")
    assert up.status_code == 202, up.json()
    assert [(r.replica_index, r.gpus, r.status) for r in _group(first)] == [
        (0, [0], "queued"), (1, [1], "queued"), (2, [2], "queued")]
    assert all(r.spec["replicas"] == 3 for r in _group(first))
    down = _client(operator).post(url, {"replicas": 1}, content_type="application/json")
    assert down.status_code == 202
    # The highest-index rows stop (queued ones at once) and give their GPUs back.
    assert _statuses(first) == [(0, "queued"), (1, "stopped"), (2, "stopped")]
    assert list(GpuLease.objects.values_list("gpu_index", flat=True)) == [0]
    # Up again: the ended rows start again as their next run, placed anew.
    again = _client(operator).post(url, {"replicas": 2}, content_type="application/json")
    assert again.status_code == 202
    assert _statuses(first) == [(0, "queued"), (1, "queued"), (2, "stopped")]
    assert _group(first)[1].run == 2
    bad = _client(operator).post(url, {"replicas": 0}, content_type="application/json")
    assert bad.status_code == 400 and "from 1 to 128" in bad.json()["replicas"][0]


def test_a_scale_that_does_not_fit_changes_nothing(operator, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 2
    first = queued(gpus=[0])
    answer = _client(operator).post(f"/api/deployments/{first.pk}/scale/", {"replicas": 3},
                                    content_type="application/json")
    assert answer.status_code == 400 and "Replica 2 needs 1 free GPU" in answer.json()[
        "replicas"][0]
    assert _statuses(first) == [(0, "queued")] and first.spec.get("replicas") == 1


def test_a_replica_row_and_an_ended_deployment_are_not_scaled(operator) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=2)
    replica = _group(first)[1]
    answer = _client(operator).post(f"/api/deployments/{replica.pk}/scale/", {"replicas": 3},
                                    content_type="application/json")
    assert answer.status_code == 400 and f"scale #{first.pk}" in answer.json()["replicas"][0]
    services.deployment_stop(deployment_id=first.pk)
    ended = _client(operator).post(f"/api/deployments/{first.pk}/scale/", {"replicas": 3},
                                   content_type="application/json")
    assert ended.status_code == 400 and "only a running deployment scales" in \
        ended.json()["status"][0]


def test_the_panels_scale_form_scales_and_says_a_refusal(operator, settings) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0])
    client = _client(operator)
    page = client.get(f"/deployments/{first.pk}/")
    assert 'id="scale-form"' in page.content.decode()
    done = client.post(f"/deployments/{first.pk}/scale/", {"replicas": "2"}, follow=True)
    assert "Scaled kimi-ddtree from 1 to 2 replicas: replica 1 starting." in \
        done.content.decode()
    assert _statuses(first) == [(0, "queued"), (1, "queued")]
    settings.GPU_COUNT = 2
    refused = client.post(f"/deployments/{first.pk}/scale/", {"replicas": "3"}, follow=True)
    assert "Scale refused (replicas): Replica 2 needs 1 free GPU" in refused.content.decode()
    assert len(_group(first)) == 2


def test_a_scale_down_says_what_stops_and_the_header_counts_as_it_says(operator) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=3)
    for row in _group(first):
        _ready(row.pk)
    client = _client(operator)
    page = client.get(f"/deployments/{first.pk}/").content.decode()
    assert '<p id="replicas-throughput">3 replicas · ' in page
    done = client.post(f"/deployments/{first.pk}/scale/", {"replicas": "1"}, follow=True)
    html = done.content.decode()
    assert "Scaled kimi-ddtree from 3 to 1 replica: replicas 1, 2 stopping." in html
    # The header agrees with the message: the spec's count, and the rows still stopping.
    assert '<p id="replicas-throughput">1 replica (1, 2 stopping) · ' in html
    for row in _group(first)[1:]:
        services.deployment_mark_stopped(deployment_id=row.pk, by="agent")
    page = client.get(f"/deployments/{first.pk}/").content.decode()
    assert '<p id="replicas-throughput">1 replica · ' in page
    again = client.post(f"/deployments/{first.pk}/scale/", {"replicas": "1"}, follow=True)
    assert "kimi-ddtree runs 1 replica already." in again.content.decode()


def test_a_viewer_sees_no_scale_form_and_is_refused_it(viewer) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0])
    client = _client(viewer)
    assert 'id="scale-form"' not in client.get(f"/deployments/{first.pk}/").content.decode()
    assert client.post(f"/deployments/{first.pk}/scale/", {"replicas": "2"}).status_code == 403


def test_stop_of_replica_zero_stops_every_replica_and_of_a_replica_that_one(operator) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=3)
    rows = _group(first)
    for row in rows:
        _ready(row.pk)
    asked = _client(operator).get(f"/deployments/{first.pk}/stop/").content.decode()
    assert "Its 2 other replicas stop with it" in asked
    assert "only this engine stops" in _client(operator).get(
        f"/deployments/{rows[2].pk}/stop/").content.decode()
    one = _client(operator).post(f"/api/deployments/{rows[2].pk}/stop/")
    assert one.status_code == 202
    assert _statuses(first) == [(0, "ready"), (1, "ready"), (2, "stopping")]
    _client(operator).post(f"/api/deployments/{first.pk}/stop/")
    assert _statuses(first) == [(0, "stopping"), (1, "stopping"), (2, "stopping")]


def test_delete_takes_replica_zero_with_its_replicas_and_refuses_a_replica_alone(operator) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=2)
    replica = _group(first)[1]
    services.deployment_stop(deployment_id=first.pk)  # queued: all stopped at once
    alone = _client(operator).delete(f"/api/deployments/{replica.pk}/")
    assert alone.status_code == 400
    assert f"it is deleted with that deployment (Delete on #{first.pk})" in \
        alone.json()["replica"][0]
    assert _client(operator).delete(f"/api/deployments/{first.pk}/").status_code == 204
    assert not Deployment.objects.exists()


def test_restart_of_replica_zero_rolls_over_its_replicas_and_of_a_replica_restarts_it_alone(
        ) -> None:
    first = queued(gpus=[0], replicas=2)
    services.deployment_stop(deployment_id=first.pk)
    replica = _group(first)[1]
    services.deployment_restart(deployment_id=replica.pk)  # this engine alone, as its run 2
    assert _statuses(first) == [(0, "stopped"), (1, "queued")] and _group(first)[1].run == 2
    rolled = services.deployment_restart(deployment_id=first.pk)  # rolling.py's, row by row
    assert rolled.rolling["kind"] == "restart" and rolled.rolling["replicas"] == [
        first.pk, replica.pk]


def test_the_served_name_counts_a_deployments_replicas_as_one() -> None:
    first = queued(gpus=[0], replicas=2)
    replica = _group(first)[1]
    _ready(first.pk)
    _ready(replica.pk)
    oom = CATALOGUE["cuda-oom-load"].diagnosis()
    services.deployment_mark_failed(deployment_id=replica.pk, last_lines=[], diagnosis=oom)
    # A replica starts again beside its own replica 0, which serves the name meanwhile.
    assert services.deployment_restart(deployment_id=replica.pk).status == "queued"
    services.deployment_mark_failed(deployment_id=first.pk, last_lines=[], diagnosis=oom)
    # Its replica 1 still serves the name: another deployment of it is refused, naming #first.
    with pytest.raises(services.DeploymentInputError) as caught:
        queued(gpus=[5])
    assert f"already served by deployment #{first.pk} 'kimi-ddtree'" in \
        caught.value.errors["name"][0]


def test_the_list_shows_replica_zero_with_its_replicas_and_hides_their_rows(viewer) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=3)
    rows = _group(first)
    _ready(rows[0].pk)
    _ready(rows[1].pk)
    listed = _client(viewer).get("/deployments/rows/").json()["deployments"]
    assert [(d["id"], d["replicas"]) for d in listed] == [(first.pk, "3 replicas (2 ready)")]
    page = _client(viewer).get("/").content.decode()
    assert "3 replicas (2 ready)" in page and f'id="deployment-{rows[1].pk}"' not in page


def test_the_page_and_the_api_list_the_replicas_and_sum_their_throughput(viewer) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=3)
    rows = _group(first)
    _ready(rows[0].pk, throughput=100.0)
    _ready(rows[1].pk, throughput=50.5)
    answer = _client(viewer).get(f"/api/deployments/{first.pk}/replicas/").json()
    assert answer["throughput"] == 150.5
    assert [(r["index"], r["id"], r["host"], r["gpus"], r["status"], r["run"], r["throughput"])
            for r in answer["results"]] == [
        (0, rows[0].pk, "gpu-host", [0], "ready", 1, 100.0),
        (1, rows[1].pk, "gpu-host", [1], "ready", 1, 50.5),
        (2, rows[2].pk, "gpu-host", [2], "queued", 1, None)]
    page = _client(viewer).get(f"/deployments/{rows[1].pk}/").content.decode()
    assert "throughput 150.5 tok/s" in page and 'data-replica="2"' in page
    assert f'replica 1 of <a href="/deployments/{first.pk}/">#{first.pk}</a>' in page
    assert "placed: gpu-host: 7 free GPUs, this panel&#x27;s host" in page


FORM = {"recipe": "kimi-k2.6-ddtree", "name": "kimi-form", "model_path": "/models/Kimi-K2.6",
        "drafter_path": "/models/Kimi-K2.6-DFlash", "algorithm": "DDTREE", "block_size": "8",
        "tree_budget": "32", "tp_size": "1", "gpu_ids": "0", "attention_backend": "fa3",
        "self_check": "on", "confirm_warnings": "on"}


def test_the_form_deploys_replicas_and_shows_a_refusal_beside_its_field(operator, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 2
    client = _client(operator)
    page = client.get("/deployments/new/").content.decode()
    for field in ("replicas", "host", "companion"):
        assert f'id="id_{field}"' in page, field
    assert "Replicas, host and companion have their own fields above." in page
    refused = client.post("/deployments/new/", {**FORM, "replicas": "3"})
    assert refused.status_code == 400
    assert refused.context["form"].errors["replicas"][0].startswith(
        "Replica 2 needs 1 free GPU on one host: gpu-host has 0 free")
    in_box = client.post("/deployments/new/", {**FORM, "replicas": "1", "more_spec": "replicas: 2"})
    assert in_box.status_code == 400 and in_box.context["form"].errors["more_spec"] == [
        "replicas has its own field above: set it in Replicas and take its line out of this box."]
    elsewhere = client.post("/deployments/new/", {**FORM, "replicas": "1", "host": "nowhere"})
    assert elsewhere.status_code == 400 and elsewhere.context["form"].errors["host"]
    assert not Deployment.objects.exists()
    made = client.post("/deployments/new/", {**FORM, "replicas": "2", "host": "gpu-host"})
    assert made.status_code == 302
    first = Deployment.objects.get(replica_of__isnull=True)
    assert [(r.replica_index, r.gpus) for r in _group(first)] == [(0, [0]), (1, [1])]
    assert first.spec["replicas"] == 2 and first.spec["host"] == "gpu-host"


def test_the_form_names_a_companion_and_its_clone_keeps_it(operator, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 2
    client = _client(operator)
    queued(name="kimi-base", gpus=[1], engine__speculative_algorithm="NONE")
    made = client.post("/deployments/new/", {**FORM, "replicas": "1", "companion": "kimi-base"})
    assert made.status_code == 302, made.content.decode()[:2000]
    ddt = Deployment.objects.get(name="kimi-form")
    assert ddt.spec["companion"] == "kimi-base"
    form = client.get(f"/deployments/new/?from={ddt.pk}").context["form"]
    assert (form.initial["replicas"], form.initial["companion"]) == (1, "kimi-base")


def test_the_redeploy_form_fills_block_yaml_that_stays_valid_with_a_line_added(operator) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=3, shm_size="8g")
    client = _client(operator)
    url = f"/deployments/new/?from={first.pk}&redeploy=1"
    initial = client.get(url).context["form"].initial
    assert initial["replicas"] == 3
    assert initial["more_spec"] == "shm_size: 8g"  # block YAML: one key a line, no {...}
    added = initial["more_spec"] + "\nrestart:\n  policy: on-failure\n"
    post = {k: v for k, v in initial.items() if v is not None and v is not False}
    answer = client.post(url, {**post, "more_spec": added, "confirm_warnings": "on"})
    assert answer.status_code == 302, answer.content.decode()[:3000]
    assert Deployment.objects.get(pk=first.pk).rolling["columns"]["spec"]["restart"]["policy"] == \
        "on-failure"


def test_a_replica_whose_hosts_agent_is_silent_is_unknown_with_no_throughput(
        viewer, settings) -> None:  # type: ignore[no-untyped-def]
    first = queued(gpus=[0], replicas=2)
    rows = _group(first)
    _ready(rows[0].pk, throughput=100.0)
    _ready(rows[1].pk, throughput=50.0)
    # Replica 1's host stopped reporting (a lost host): its agent's report is old.
    Deployment.objects.filter(pk=rows[1].pk).update(agent_id="agent@gpu-b")
    host_reported(agent_id="agent@gpu-b", name="gpu-b",
                  heartbeat_at=timezone.now() - timedelta(seconds=settings.AGENT_SILENT_S + 5))
    answer = _client(viewer).get(f"/api/deployments/{first.pk}/replicas/").json()
    assert [(r["index"], r["status"], r["throughput"]) for r in answer["results"]] == [
        (0, "ready", 100.0), (1, "unknown", None)]
    assert answer["throughput"] == 100.0
    page = _client(viewer).get(f"/deployments/{first.pk}/").content.decode()
    assert 'status-unknown">unknown' in page
