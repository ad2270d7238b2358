"""A silent engine agent: its deployments show `unknown` with an agent-silent alert on the
list, Hosts and detail pages and in the API, and their stored status again once it reports."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.hostrows import host_reported
from tests.rows import ready
from web.deployments.models import Deployment
from web.fleet.models import FleetHost

pytestmark = pytest.mark.django_db
AGENT = "agent@gpu-host"


def _watched(silent_s: float) -> Deployment:
    """A ready deployment its agent stepped, the agent's last report silent_s ago."""
    deployment = ready()
    at = timezone.now() - timedelta(seconds=silent_s)
    Deployment.objects.filter(pk=deployment.pk).update(agent_id=AGENT)
    host_reported(name="gpu-host", agent_id=AGENT, heartbeat_at=at, docker={"nvidia": True})
    return Deployment.objects.get(pk=deployment.pk)


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _report_now() -> None:
    FleetHost.objects.filter(agent_id=AGENT).update(heartbeat_at=timezone.now())


def test_the_list_shows_a_deployment_of_a_silent_agent_as_unknown_with_an_alert(viewer) -> None:  # type: ignore[no-untyped-def]
    deployment = _watched(silent_s=140)
    client = _client(viewer)
    page = client.get("/").content.decode()
    row = page[page.index(f'id="deployment-{deployment.pk}"'):]
    row = row[:row.index("</tr>")]
    assert "status-unknown" in row and "agent silent" in row and "last known ready" in row
    assert "is silent for 2 min 2" in row
    assert "The engine agent agent@gpu-host is silent for 2 min 2" in page  # the host card
    rows = client.get("/deployments/rows/").json()["deployments"]
    assert rows[0]["status"] == "unknown" and rows[0]["throughput"] == "–"
    assert "agent@gpu-host is silent" in rows[0]["silent"]
    _report_now()
    rows = client.get("/deployments/rows/").json()["deployments"]
    assert rows[0]["status"] == "ready" and rows[0]["silent"] == ""
    assert "agent-silent" not in client.get("/").content.decode()


def test_an_agent_silent_for_less_than_the_setting_is_not_silent(viewer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENT_SILENT_S = 30
    _watched(silent_s=20)
    assert _client(viewer).get("/deployments/rows/").json()["deployments"][0]["status"] == "ready"
    settings.AGENT_SILENT_S = 10
    assert _client(viewer).get("/deployments/rows/").json()["deployments"][0]["status"] == "unknown"


def test_the_detail_page_shows_unknown_an_alert_and_its_poll_says_when_it_is_back(viewer) -> None:  # type: ignore[no-untyped-def]
    deployment = _watched(silent_s=140)
    client = _client(viewer)
    page = client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert 'class="status status-unknown" data-status="ready"' in page
    assert 'data-alert="agent-silent"' in page and "docker compose up -d agent" in page
    silence = json.loads(page.split('id="agent-silence" type="application/json">')[1]
                         .split("</script>")[0])
    assert silence["silent"] and silence["silent_s"] >= 140
    polled = client.get(f"/deployments/{deployment.pk}/agent/").json()
    assert polled["status"] == "ready" and polled["silence"]["agent_id"] == AGENT
    _report_now()
    assert client.get(f"/deployments/{deployment.pk}/agent/").json()["silence"] is None
    page = client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert 'data-alert="agent-silent"' not in page and "status-ready" in page


def test_the_hosts_page_says_the_agent_is_silent(viewer) -> None:  # type: ignore[no-untyped-def]
    _watched(silent_s=140)
    page = _client(viewer).get("/hosts/").content.decode()
    assert "agent-silent" in page and "Its deployments show <code>unknown</code>" in page
    _report_now()
    assert "agent-silent" not in _client(viewer).get("/hosts/").content.decode()


def test_the_api_lists_the_hosts_with_the_silent_agent_and_its_unknown_deployments(viewer) -> None:  # type: ignore[no-untyped-def]
    deployment = _watched(silent_s=140)
    client = _client(viewer)
    host = client.get("/api/hosts/").json()["hosts"][0]
    assert host["agent"]["silent"] is True and host["agent"]["silent_s"] >= 140
    assert "docker compose logs agent" in host["agent"]["fix"]
    assert host["deployments"] == [{"id": deployment.pk, "name": deployment.name,
                                    "status": "ready", "shown_status": "unknown"}]
    _report_now()
    host = client.get("/api/hosts/").json()["hosts"][0]
    assert host["agent"] == {"agent_id": AGENT, "silent": False}
    assert host["deployments"][0]["shown_status"] == "ready"


def test_a_stopped_deployment_is_never_unknown(viewer) -> None:  # type: ignore[no-untyped-def]
    deployment = _watched(silent_s=600)
    Deployment.objects.filter(pk=deployment.pk).update(status="stopped")
    assert _client(viewer).get("/deployments/rows/").json()["deployments"][0]["status"] == "stopped"
    assert _client(viewer).get(f"/deployments/{deployment.pk}/agent/").json()["silence"] is None


def test_a_person_without_a_role_may_not_read_the_hosts(django_user_model) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(django_user_model.objects.create_user(username="nobody", password="x-pass-12"))
    assert client.get("/api/hosts/").status_code == 403
