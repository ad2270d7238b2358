"""Conditional status reads (a dashboard polling an unchanged deployment costs no body): the
detail and the summary carry an ETag that is the deployment row's version; a client that sends
it back gets 304 Not Modified while nothing changed, and the next read after any write (a
transition, a point, an alert, an event) is the new state at once, because the writers keep the
summary on the row."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from appliance.runtime import series
from appliance.runtime.alerts import Alert
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment
from web.deployments.services.metrics import deployment_apply_alerts, metrics_store_point

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment() -> Deployment:
    return deploying.deployment_create(data=spec(), confirm_warnings=True)


@pytest.fixture
def api(viewer: Any, token_for: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(viewer)}")
    return client


def _url(deployment: Deployment, read: str) -> str:
    return f"/api/deployments/{deployment.pk}/{read}"


@pytest.mark.parametrize("read", ["", "summary/"])
def test_a_read_answers_304_to_its_own_etag_until_the_deployment_changes(
        deployment: Deployment, api: APIClient, read: str) -> None:
    first = api.get(_url(deployment, read))
    etag = first["ETag"]
    assert first.status_code == 200 and etag.startswith('"') and etag.endswith('"')
    assert first["Cache-Control"] == "private, no-cache"  # always asked again, never shared
    again = api.get(_url(deployment, read), HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304 and again.content == b"" and again["ETag"] == etag
    assert services.deployment_mark_building(deployment_id=deployment.pk)
    changed = api.get(_url(deployment, read), HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed.json()["status"] == "building"
    assert changed["ETag"] != etag


def test_the_detail_and_the_summary_have_etags_of_their_own(deployment: Deployment,
                                                            api: APIClient) -> None:
    detail_etag = api.get(_url(deployment, ""))["ETag"]
    summary = api.get(_url(deployment, "summary/"), HTTP_IF_NONE_MATCH=detail_etag)
    assert summary.status_code == 200 and summary["ETag"] != detail_etag


def test_a_stored_point_is_in_the_next_summary(deployment: Deployment, api: APIClient) -> None:
    etag = api.get(_url(deployment, "summary/"))["ETag"]
    metrics_store_point(deployment_id=deployment.pk, resolution_s=2,
                        point=series.MetricPoint(t=1_790_000_000.0, throughput=412.5))
    answer = api.get(_url(deployment, "summary/"), HTTP_IF_NONE_MATCH=etag)
    assert answer.status_code == 200
    assert answer.json()["metrics"]["throughput"] == 412.5
    assert answer.json()["metrics"]["t"] == 1_790_000_000.0


def test_an_alert_raised_and_cleared_is_in_the_next_summary(deployment: Deployment,
                                                            api: APIClient) -> None:
    deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
        Alert("kv-high", "firing", "warning", "KV cache usage is 97%.", fix="Lower it.")])
    [raised] = api.get(_url(deployment, "summary/")).json()["alert_history"]
    assert raised["state"] == "firing" and raised["summary"] == "KV cache usage is 97%."
    assert raised["raised_at"].endswith("Z") and raised["cleared_at"] is None
    etag = api.get(_url(deployment, "summary/"))["ETag"]
    deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
        Alert("kv-high", "resolved", "warning", "KV cache usage is 80%.")])
    answer = api.get(_url(deployment, "summary/"), HTTP_IF_NONE_MATCH=etag)
    [cleared] = answer.json()["alert_history"]
    assert answer.status_code == 200 and cleared["state"] == "resolved"
    assert cleared["raised_at"] == raised["raised_at"] and cleared["cleared_at"] > raised["raised_at"]
    assert cleared["summary"] == "KV cache usage is 97%."  # the raise's, beside the clear's
    assert cleared["cleared_summary"] == "KV cache usage is 80%."


def test_an_appended_event_changes_the_detail(deployment: Deployment, api: APIClient) -> None:
    first = api.get(_url(deployment, ""))
    services.events_append(deployment_id=deployment.pk, events=[("log", {"text": "hello"})])
    answer = api.get(_url(deployment, ""), HTTP_IF_NONE_MATCH=first["ETag"])
    assert answer.status_code == 200 and answer.json()["last_seq"] == first.json()["last_seq"] + 1


def test_an_etag_opens_nothing_without_a_token(deployment: Deployment, api: APIClient) -> None:
    etag = api.get(_url(deployment, ""))["ETag"]
    assert APIClient().get(_url(deployment, ""), HTTP_IF_NONE_MATCH=etag).status_code == 401


def test_the_graph_widths_the_spec_needs_are_kept_at_create(deployment: Deployment,
                                                            api: APIClient) -> None:
    assert deployment.graph_needed == {"target": 33, "draft": 8}
    widths = api.get(_url(deployment, "summary/")).json()["graph_widths"]
    assert {w["role"]: w["needed"] for w in widths} == {"target": 33, "draft": 8}
