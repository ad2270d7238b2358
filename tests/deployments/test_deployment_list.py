"""The deployments list (views.deployment_list and its JSON rows for list.js): status, uptime
since ready, current throughput from the latest stored metric point, the endpoint clients
call (the gateway's, with the model they name: never the engine's own address);
one query for the rows however many there are."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from appliance.runtime import series
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, MetricPoint

pytestmark = pytest.mark.django_db


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _ready(name: str, gpu: int, ready_for_s: float = 0.0) -> Deployment:
    deployment = deploying.deployment_create(data=spec(name=name, gpus=[gpu]),
                                             confirm_warnings=True)
    assert services.deployment_mark_starting(deployment_id=deployment.pk, image="engine:test")
    assert services.deployment_mark_ready(deployment_id=deployment.pk,
                                          engine_url=f"http://appliance-engine-{name}:30000")
    if ready_for_s:  # as if it had been serving that long
        Deployment.objects.filter(pk=deployment.pk).update(
            ready_at=timezone.now() - timedelta(seconds=ready_for_s))
    return Deployment.objects.get(pk=deployment.pk)


def _point(deployment: Deployment, age_s: float, throughput: float) -> None:
    t = timezone.now().timestamp() - age_s
    MetricPoint.of(deployment.pk, series.MetricPoint(t=t, throughput=throughput), 2).save()


def _rows(user) -> dict[int, dict]:  # type: ignore[no-untyped-def]
    response = _client(user).get(reverse("deployments:list-rows"))
    assert response.status_code == 200
    return {row["id"]: row for row in response.json()["deployments"]}


def test_a_ready_deployment_shows_its_uptime_throughput_and_endpoint(viewer) -> None:  # type: ignore[no-untyped-def]
    serving = _ready("serving", gpu=0, ready_for_s=3 * 3600 + 125)
    _point(serving, age_s=40, throughput=250.0)
    _point(serving, age_s=2, throughput=312.44)  # the latest point is the current figure
    row = _rows(viewer)[serving.pk]
    assert row["status"] == "ready"
    assert row["uptime"] == "3 h 02 min" and row["uptime_s"] == pytest.approx(10925, abs=5)
    assert row["throughput"] == "312.4 tok/s" and row["throughput_tok_s"] == 312.44
    assert (row["endpoint"], row["model"]) == ("http://testserver/v1", "serving")
    assert row["ready_since"].endswith(" UTC") and row["throughput_at"].endswith(" UTC")
    page = _client(viewer).get(reverse("deployments:list")).content.decode()
    assert f'<tr id="deployment-{serving.pk}">' in page
    assert ">3 h 02 min</td>" in page and ">312.4 tok/s</td>" in page
    assert ("<code>http://testserver/v1</code> <small>model <code>serving</code></small>"
            in page)
    assert "appliance-engine-serving" not in page  # on the engines' network: nobody reaches it
    # A served_model_name is what clients name, so it is what the Endpoint says.
    named = _ready("named", gpu=1)
    Deployment.objects.filter(pk=named.pk).update(
        spec={**named.spec, "engine": {**named.spec["engine"], "served_model_name": "kimi"}})
    assert _rows(viewer)[named.pk]["model"] == "kimi"


def test_a_deployment_that_is_not_serving_shows_dashes_not_old_figures(viewer) -> None:  # type: ignore[no-untyped-def]
    queued = deploying.deployment_create(data=spec(name="queued", gpus=[1]),
                                         confirm_warnings=True)
    stopped = _ready("stopped", gpu=2)
    _point(stopped, age_s=5, throughput=300.0)
    assert services.deployment_mark_stopping(deployment_id=stopped.pk)
    assert services.deployment_mark_stopped(deployment_id=stopped.pk)
    stale = _ready("stale", gpu=3)
    _point(stale, age_s=600, throughput=290.0)  # the agent stopped reporting ten minutes ago
    rows = _rows(viewer)
    for pk in (queued.pk, stopped.pk):
        assert (rows[pk]["uptime"], rows[pk]["throughput"], rows[pk]["endpoint"]) == (
            "–", "–", ""), rows[pk]
    assert rows[stopped.pk]["status"] == "stopped"
    assert rows[stale.pk]["uptime"] != "–" and rows[stale.pk]["throughput"] == "–"
    page = _client(viewer).get(reverse("deployments:list")).content.decode()
    assert '<td class="endpoint">–</td>' in page


def test_the_rows_cost_the_same_queries_for_one_deployment_or_many(  # type: ignore[no-untyped-def]
        viewer, django_assert_max_num_queries) -> None:
    client = _client(viewer)
    first = _ready("first", gpu=0)
    _point(first, age_s=1, throughput=100.0)
    with django_assert_max_num_queries(10) as one:
        assert client.get(reverse("deployments:list-rows")).status_code == 200
    for gpu in range(1, 8):
        deployment = _ready(f"more-{gpu}", gpu=gpu)
        for age in (30, 20, 10):
            _point(deployment, age_s=age, throughput=100.0 + gpu)
    with django_assert_max_num_queries(len(one.captured_queries)) as many:
        rows = client.get(reverse("deployments:list-rows")).json()["deployments"]
    assert len(rows) == 8 and all(r["throughput"] != "–" for r in rows)
    row_queries = [q["sql"] for q in many.captured_queries if "deployments_deployment" in q["sql"]]
    assert len(row_queries) == 1, row_queries
    # The page itself: the same rows query, plus the hosts and the simulator banner's read.
    with django_assert_max_num_queries(len(one.captured_queries) + 2):
        assert client.get(reverse("deployments:list")).status_code == 200


def test_the_rows_need_the_viewer_role(django_user_model) -> None:  # type: ignore[no-untyped-def]
    nobody = django_user_model.objects.create_user(username="nora", password="no-role-pass-1")
    assert _client(nobody).get(reverse("deployments:list-rows")).status_code == 403
    anonymous = Client().get(reverse("deployments:list-rows"))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
