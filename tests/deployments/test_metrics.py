"""A deployment's metric series: bounded storage (services/metrics.py), its alerts, and
GET /api/deployments/<id>/metrics/ (range, step, schema)."""

from __future__ import annotations

import re
import time

import pytest
from django.test import Client
from rest_framework.test import APIClient

from appliance.runtime import series
from appliance.runtime.alerts import Alert
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import selectors, services
from web.deployments.models import Deployment, Event, MetricPoint
from web.deployments.services.metrics import (
    deployment_apply_alerts,
    metrics_compact,
    metrics_prune,
    metrics_store_point,
)

pytestmark = pytest.mark.django_db
NOW = 1_789_999_980.0  # a fixed instant on a whole minute (2026-09-21)


@pytest.fixture
def deployment() -> Deployment:
    return deploying.deployment_create(data=spec(), confirm_warnings=True)


def _store(deployment: Deployment, start: float, seconds: float, every: float = 2.0) -> None:
    for i in range(int(seconds / every)):
        point = series.MetricPoint(t=start + i * every, throughput=300.0 + i % 10,
                                   accept_len=4.8, running=2.0, cuda_graph=1.0,
                                   gpus=[[90.0, 120.123, 143.77]])
        MetricPoint.of(deployment.pk, point, 2).save()


def _client(user, token_for) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(user)}")
    return client


def test_a_stored_point_is_published_live_and_not_written_as_an_event(
        deployment, live_channel) -> None:  # type: ignore[no-untyped-def]
    key = f"appliance:deployment:{deployment.pk}:points"
    live_channel.delete(key)  # a stream another run left under this id
    events_before = Event.objects.filter(deployment=deployment).count()
    metrics_store_point(deployment_id=deployment.pk,
                        point=series.MetricPoint(t=NOW, throughput=303.1), resolution_s=2)
    assert MetricPoint.objects.get(deployment=deployment).throughput == 303.1
    assert Event.objects.filter(deployment=deployment).count() == events_before
    [(_, fields)] = live_channel.xrange(key)
    assert b'"kind":"point"' in fields[b"data"] and b'"throughput":303.1' in fields[b"data"]


def test_points_older_than_an_hour_are_merged_into_one_per_minute(deployment) -> None:  # type: ignore[no-untyped-def]
    _store(deployment, NOW - 2 * 3600, 2 * 3600)  # two hours at 2 s: 3,600 points
    merged = metrics_compact(deployment_id=deployment.pk, now=NOW)
    assert merged == 1800
    rows = MetricPoint.objects.filter(deployment=deployment)
    assert rows.filter(resolution_s=60).count() == 60
    assert rows.filter(resolution_s=2).count() == 1800
    assert metrics_compact(deployment_id=deployment.pk, now=NOW) == 0  # each minute once
    minute = rows.filter(resolution_s=60).order_by("ts").first()
    assert minute is not None and minute.throughput == pytest.approx(304.5)
    assert minute.gpus == [[90.0, 120.12, 143.77]]


def test_pruning_compacts_stopped_deployments_and_drops_points_past_the_retention(
        deployment, settings) -> None:  # type: ignore[no-untyped-def]
    settings.METRICS_RETENTION_DAYS = 1
    _store(deployment, NOW - 3 * 86400, 600)  # three days old
    _store(deployment, NOW - 3 * 3600, 600)  # three hours old
    metrics_prune(now=NOW)
    rows = MetricPoint.objects.filter(deployment=deployment)
    assert rows.filter(resolution_s=2).count() == 0
    assert rows.count() == 10  # the recent ten minutes, one point each


def test_alert_changes_are_kept_on_the_row_and_as_events(deployment) -> None:  # type: ignore[no-untyped-def]
    firing = Alert("stall", "firing", "warning", "No progress for 300 s while loading.")
    assert deployment_apply_alerts(deployment_id=deployment.pk, alerts=[firing])
    deployment.refresh_from_db()
    assert deployment.alerts["stall"]["summary"].startswith("No progress")
    assert "raised_at" in deployment.alerts["stall"]
    resolved = Alert("stall", "resolved", "warning", "The engine moved on (ready).")
    deployment_apply_alerts(deployment_id=deployment.pk, alerts=[resolved])
    deployment.refresh_from_db()
    assert deployment.alerts == {}
    kinds = [(e.kind, e.payload["state"]) for e in Event.objects.filter(
        deployment=deployment, kind="alert").order_by("seq")]
    assert kinds == [("alert", "firing"), ("alert", "resolved")]


def test_an_agent_without_the_lease_records_no_alert(deployment) -> None:  # type: ignore[no-untyped-def]
    Deployment.objects.filter(pk=deployment.pk).update(agent_id="agent@other")
    alert = Alert("kv-high", "firing", "warning", "KV cache usage is 97%.")
    assert not deployment_apply_alerts(deployment_id=deployment.pk, alerts=[alert],
                                       agent_id="agent@me")
    assert not Event.objects.filter(deployment=deployment, kind="alert").exists()


def test_the_summary_carries_the_latest_point_and_the_firing_alerts(deployment) -> None:  # type: ignore[no-untyped-def]
    for i in range(5):  # as the engine monitor stores them: the row keeps the latest
        metrics_store_point(deployment_id=deployment.pk, resolution_s=2,
                            point=series.MetricPoint(t=NOW - 10 + 2 * i, throughput=300.0))
    deployment.refresh_from_db()
    summary = selectors.deployment_summary(deployment=deployment)
    assert summary["metrics"]["t"] == NOW - 2 and summary["alerts"] == {}


def test_the_api_returns_the_series_in_a_range_at_a_step(deployment, viewer, token_for) -> None:  # type: ignore[no-untyped-def]
    now = time.time() // 60 * 60
    _store(deployment, now - 600, 600)
    api = _client(viewer, token_for)
    body = api.get(f"/api/deployments/{deployment.pk}/metrics/",
                   {"start": now - 300, "end": now, "step": 60}).json()
    assert body["step"] == 60 and body["units"]["throughput"] == "tok/s"
    assert [p["t"] for p in body["points"]] == [now - 300 + 60 * i for i in range(5)]
    assert body["points"][0]["throughput"] == pytest.approx(304.5)
    assert body["points"][0]["gpus"][0] == pytest.approx([90.0, 120.12, 143.77])
    raw = api.get(f"/api/deployments/{deployment.pk}/metrics/").json()  # last 15 min, as stored
    assert len(raw["points"]) == 300 and raw["step"] is None


def test_the_api_takes_iso_times_and_explains_bad_ranges(deployment, viewer, token_for) -> None:  # type: ignore[no-untyped-def]
    api = _client(viewer, token_for)
    url = f"/api/deployments/{deployment.pk}/metrics/"
    ok = api.get(url, {"start": "2026-11-30T10:00:00Z", "end": "2026-11-30T11:00:00Z"})
    assert ok.status_code == 200 and ok.json()["start"] == 1796032800.0
    assert "start" in api.get(url, {"start": "yesterday"}).json()
    assert "start" in api.get(url, {"start": 200, "end": 100}).json()
    assert "step" in api.get(url, {"step": "0.1"}).json()
    assert "step" in api.get(url, {"start": 0, "end": NOW, "step": 1}).json()


def test_the_series_needs_the_viewer_role(deployment, django_user_model, token_for) -> None:  # type: ignore[no-untyped-def]
    from knox.models import AuthToken

    nobody = django_user_model.objects.create_user(username="nobody", password="pw-nobody-1")
    # No role, so no scoped token can be made for it (web.accounts.tokens): one from before.
    _, token = AuthToken.objects.create(user=nobody)
    assert _client(nobody, lambda user: token).get(
        f"/api/deployments/{deployment.pk}/metrics/").status_code == 403
    assert APIClient().get(f"/api/deployments/{deployment.pk}/metrics/").status_code == 401


def test_the_series_endpoint_is_in_the_openapi_schema(viewer, token_for) -> None:  # type: ignore[no-untyped-def]
    schema = _client(viewer, token_for).get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/deployments/{id}/metrics/"]["get"]
    assert {p["name"] for p in operation["parameters"]} >= {"start", "end", "step"}
    point = schema["components"]["schemas"]["MetricPoint"]["properties"]
    assert set(series.SCALARS) | {"t", "gpus"} == set(point)


def test_each_status_change_notes_when_it_began_for_the_phase_durations(deployment) -> None:  # type: ignore[no-untyped-def]
    services.deployment_mark_building(deployment_id=deployment.pk)
    services.deployment_mark_starting(deployment_id=deployment.pk, image="img")
    deployment.refresh_from_db()
    assert set(deployment.status_times) == {"building", "starting"}
    assert deployment.status_times["building"] <= deployment.status_times["starting"]


def test_each_alert_says_when_it_was_raised_and_cleared(deployment, viewer, token_for) -> None:  # type: ignore[no-untyped-def]
    stall = Alert("stall", "firing", "warning", "No progress for 300 s while loading.",
                  fix="Read its last log lines.")
    deployment_apply_alerts(deployment_id=deployment.pk, alerts=[stall])
    deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
        Alert("kv-high", "firing", "warning", "KV cache usage is 97%.")])
    deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
        Alert("stall", "resolved", "warning", "The engine moved on (ready).")])
    events = {(e.payload["id"], e.payload["state"]): e for e in Event.objects.filter(
        deployment=deployment, kind="alert")}
    raised = events["stall", "firing"].payload["raised_at"]
    assert events["stall", "resolved"].payload["raised_at"] == raised
    assert events["stall", "resolved"].payload["cleared_at"] > raised

    body = _client(viewer, token_for).get(f"/api/deployments/{deployment.pk}/summary/").json()
    assert set(body["alerts"]) == {"kv-high"} and body["alerts"]["kv-high"]["raised_at"]
    firing, cleared = body["alert_history"]  # firing first, then cleared
    assert (firing["id"], firing["state"], firing["cleared_at"]) == ("kv-high", "firing", None)
    assert cleared["id"] == "stall" and cleared["state"] == "resolved"
    assert cleared["summary"] == "No progress for 300 s while loading."
    assert cleared["cleared_summary"] == "The engine moved on (ready)."
    assert cleared["raised_at"] < cleared["cleared_at"]

    client = Client()
    client.force_login(viewer)
    page = client.get(f"/deployments/{deployment.pk}/").content.decode()
    when = re.findall(r'data-alert="(\w[\w-]*)".*?<span class="when">(.*?)</span>', page)
    assert [w[0] for w in when] == ["kv-high", "stall"]
    assert re.fullmatch(r"raised \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", when[0][1]), when
    assert re.fullmatch(r"raised .* UTC · cleared \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: "
                        r"The engine moved on \(ready\)\.", when[1][1]), when
    assert 'class="severity-warning cleared" data-alert="stall"' in page
