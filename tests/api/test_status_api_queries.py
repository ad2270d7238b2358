"""The status reads' cost, held fixed so that a read stays as cheap as a trivial view: GET
/api/deployments/<id>/ and .../summary/ with an API token are one statement (the token, its
user's standing and permission, and the deployment row: web/api/selectors.py), with a session
the session, the user, the user's permissions and the row (four), however many deployments,
events, alerts and metric points there are."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from appliance.runtime import series
from appliance.runtime.alerts import Alert
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment
from web.deployments.services.metrics import deployment_apply_alerts, metrics_store_point
from web.deployments.simulator import simulator_images_recent

pytestmark = pytest.mark.django_db
READS = ("", "summary/")


def _api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _queries(api: APIClient, url: str, **headers: str) -> tuple[int, list[str]]:
    # The simulator's image tags (the bodies' `simulator`) are read once a process every
    # SIMULATOR_IMAGES_TTL_S, not a read's cost: read before the count, as a warm process has.
    simulator_images_recent()
    with CaptureQueriesContext(connection) as captured:
        status = api.get(url, **headers).status_code
    return status, [q["sql"] for q in captured.captured_queries]


def _grow(deployment: Deployment, *, events: int, others: int) -> None:
    """A long life: log lines, alerts raised and cleared, metric points, other deployments."""
    for start in range(0, events, 500):
        services.events_append(deployment_id=deployment.pk, events=[
            ("log", {"text": f"Decode batch. line {start + i}"}) for i in range(500)])
    for i in range(3):
        deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
            Alert(f"alert-{i}", "firing", "warning", f"alert {i}")])
        deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
            Alert(f"alert-{i}", "resolved", "warning", "over")])
    for i in range(20):
        metrics_store_point(deployment_id=deployment.pk, resolution_s=2,
                            point=series.MetricPoint(t=1_790_000_000.0 + 2 * i, throughput=1.0))
    Deployment.objects.bulk_create([
        Deployment(name=f"other-{i}", spec=spec(name=f"other-{i}"), recipe="r",
                   algorithm="DDTREE", gpus=[i % 8]) for i in range(others)])


def test_the_detail_and_the_summary_cost_one_statement_however_long_the_deployment_lived(
        viewer: Any, token_for: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    api = _api(token_for(viewer))
    fresh = {read: _queries(api, f"/api/deployments/{deployment.pk}/{read}") for read in READS}
    _grow(deployment, events=3_000, others=30)
    grown = {read: _queries(api, f"/api/deployments/{deployment.pk}/{read}") for read in READS}
    for read in READS:
        assert fresh[read][0] == grown[read][0] == 200
        assert len(fresh[read][1]) == len(grown[read][1]) == 1, grown[read][1]
    # The row holds everything the summary shows: no event, alert or point is read.
    assert not any("deployments_event" in sql or "metricpoint" in sql
                   for read in READS for sql in grown[read][1])
    body = api.get(f"/api/deployments/{deployment.pk}/summary/").json()
    assert len(body["alert_history"]) == 3 and body["metrics"]["t"] == 1_790_000_038.0


def test_a_304_costs_the_same_one_statement(viewer: Any, token_for: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    api = _api(token_for(viewer))
    for read in READS:
        url = f"/api/deployments/{deployment.pk}/{read}"
        etag = api.get(url)["ETag"]
        status, queries = _queries(api, url, HTTP_IF_NONE_MATCH=etag)
        assert status == 304 and len(queries) == 1, queries


def test_a_session_read_costs_four_queries_however_long_the_deployment_lived(
        viewer: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    session = APIClient()
    session.force_login(viewer)
    _grow(deployment, events=1_000, others=10)
    for read in READS:
        status, queries = _queries(session, f"/api/deployments/{deployment.pk}/{read}")
        assert status == 200 and len(queries) == 4, queries
        assert not any("deployments_event" in sql or "metricpoint" in sql for sql in queries)
