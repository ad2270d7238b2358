"""A row whose host is lost (its agent silent: no host report for APPLIANCE_AGENT_SILENT_S)
reads `unknown` in every answer of the API and the pages, never the `ready` it last
reported: the detail and the summary (a token's fast read, a session's, the ASGI path before
Django), the list, the replicas, the hosts, the HTML list's count. Its ETag changes with the
silence though the row did not, and the stored status comes back once the agent reports."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from tests.hostrows import host_reported
from tests.specs import spec
from web.api.asgi import StatusReads
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment
from web.serving import django_application

READS = ("", "summary/")


def _ready(pk: int, agent: str) -> None:
    services.deployment_mark_starting(deployment_id=pk, image="img", start_token=f"t{pk}")
    services.deployment_mark_ready(deployment_id=pk)
    Deployment.objects.filter(pk=pk).update(agent_id=agent)  # as the agent's claim sets it


def _report(agent: str, *, age_s: float) -> None:
    host_reported(name=agent.split("@")[1], agent_id=agent,
                  heartbeat_at=timezone.now() - timedelta(seconds=age_s))


def _replicated(settings: Any) -> list[Deployment]:
    """Three ready replicas: 0 and 1 watched by agent@sim-a, 2 by agent@sim-b."""
    settings.AGENT_SILENT_S = 30
    first = deploying.deployment_create(data=spec(replicas=3), confirm_warnings=True)
    rows = [first, *Deployment.objects.filter(replica_of=first).order_by("replica_index")]
    for row, agent in zip(rows, ("agent@sim-a", "agent@sim-a", "agent@sim-b"), strict=True):
        _ready(row.pk, agent)
    _report("agent@sim-a", age_s=1)
    _report("agent@sim-b", age_s=1)
    return rows


def _statuses(api: APIClient | Client, rows: list[Deployment]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for row in rows:
        for read in READS:
            answer = api.get(f"/api/deployments/{row.pk}/{read}")
            assert answer.status_code == 200
            seen[f"{row.pk}/{read}"] = answer.json()["status"]
    listed = api.get("/api/deployments/").json()["results"]
    seen["list"] = {d["id"]: d["status"] for d in listed}
    replicas = api.get(f"/api/deployments/{rows[0].pk}/replicas/").json()
    seen["replicas"] = [r["status"] for r in replicas["results"]]
    return seen


@pytest.mark.django_db
def test_a_lost_hosts_rows_read_unknown_in_every_api_answer_and_the_list_count(
        settings: Any, viewer: Any, token_for: Any) -> None:
    rows = _replicated(settings)
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION=f"Token {token_for(viewer)}")
    session = APIClient()
    session.force_login(viewer)
    lost = rows[2]
    before = token.get(f"/api/deployments/{lost.pk}/")
    assert before.json()["status"] == "ready" and "silence" not in before.json()
    page = Client()
    page.force_login(viewer)
    assert "3 replicas (3 ready)" in page.get("/").content.decode()

    _report("agent@sim-b", age_s=42)  # sim-b paused 42 s ago
    for api in (token, session):
        seen = _statuses(api, rows)
        assert seen[f"{lost.pk}/"] == seen[f"{lost.pk}/summary/"] == "unknown", seen
        assert seen[f"{rows[1].pk}/"] == seen[f"{rows[0].pk}/summary/"] == "ready", seen
        assert seen["list"][lost.pk] == "unknown" and seen["list"][rows[0].pk] == "ready"
        assert seen["replicas"] == ["ready", "ready", "unknown"]
    body = token.get(f"/api/deployments/{lost.pk}/").json()
    assert body["silence"]["agent_id"] == "agent@sim-b"
    assert body["silence"]["last_known_status"] == "ready"
    assert "docker compose" in body["silence"]["fix"]
    # The row did not change; its ETag did, so a poller holding the old one hears of it.
    again = token.get(f"/api/deployments/{lost.pk}/",
                      HTTP_IF_NONE_MATCH=before["ETag"])
    assert again.status_code == 200 and again.json()["status"] == "unknown"
    assert again["ETag"] != before["ETag"]
    assert token.get(f"/api/deployments/{lost.pk}/",
                     HTTP_IF_NONE_MATCH=again["ETag"]).status_code == 304
    hosts = {h["name"]: h for h in token.get("/api/hosts/").json()["hosts"]}
    assert hosts["sim-b"]["deployments"][0]["shown_status"] == "unknown"
    html = page.get("/").content.decode()
    assert "3 replicas (2 ready, 1 unknown)" in html, html

    _report("agent@sim-a", age_s=60)  # both hosts lost: replica 0 itself too
    assert "3 replicas (0 ready, 3 unknown)" in page.get("/").content.decode()
    assert _statuses(token, rows)["replicas"] == ["unknown"] * 3

    _report("agent@sim-a", age_s=0)
    _report("agent@sim-b", age_s=0)  # both back: the stored status again, a new ETag
    back = token.get(f"/api/deployments/{lost.pk}/", HTTP_IF_NONE_MATCH=again["ETag"])
    assert back.status_code == 200 and back.json()["status"] == "ready"
    assert "silence" not in back.json() and back["ETag"] == before["ETag"]
    assert "3 replicas (3 ready)" in page.get("/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_asgi_fast_path_hands_a_silent_agents_row_to_django_which_says_unknown(
        settings: Any, viewer: Any, token_for: Any) -> None:
    rows = _replicated(settings)
    lost = rows[2]
    django_app, asked = django_application(), []

    async def django(scope: Any, receive: Any, send: Any) -> None:
        asked.append(scope["path"])
        await django_app(scope, receive, send)

    app = StatusReads(django)
    assert app.enabled
    auth = (b"authorization", f"Token {token_for(viewer)}".encode())

    async def get(path: str) -> tuple[int, bytes]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "query_string": b"",
                 "root_path": "", "scheme": "http", "http_version": "1.1",
                 "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
                 "headers": [(b"host", b"127.0.0.1"), auth]}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    async def reads() -> None:
        try:
            for read in READS:
                path = f"/api/deployments/{lost.pk}/{read}"
                for _ in range(3):  # the first is Django's (learnt), the rest early
                    status, body = await get(path)
                    assert status == 200 and b'"status":"ready"' in body
                assert asked.count(path) == 1  # (the row renders: its agent_id was written)
                await asyncio.to_thread(_report, "agent@sim-b", age_s=45)
                for _ in range(2):
                    status, body = await get(path)
                    assert status == 200 and b'"status":"unknown"' in body, body
                    assert b'"last_known_status":"ready"' in body
                assert asked.count(path) == 3  # a silent agent's row is Django's
                await asyncio.to_thread(_report, "agent@sim-b", age_s=0)
                status, body = await get(path)
                assert status == 200 and b'"status":"ready"' in body
                assert asked.count(path) == 3  # back on the early path
        finally:
            await app.close()

    asyncio.run(reads())


@pytest.mark.django_db
def test_the_pages_live_ask_carries_the_replicas_table_with_a_lost_hosts_row_unknown(
        settings: Any, viewer: Any) -> None:
    rows = _replicated(settings)
    page = Client()
    page.force_login(viewer)
    asked = page.get(f"/deployments/{rows[0].pk}/agent/").json()
    assert [r["status"] for r in asked["replicas"]] == ["ready"] * 3
    assert asked["replicas_heading"] == "3 replicas"
    assert asked["replicas"][2]["url"] == f"/deployments/{rows[2].pk}/"
    _report("agent@sim-b", age_s=40)
    asked = page.get(f"/deployments/{rows[0].pk}/agent/").json()
    assert [r["status"] for r in asked["replicas"]] == ["ready", "ready", "unknown"]
    assert asked["silence"] is None  # replica 0's own agent reports
    assert page.get(f"/deployments/{rows[2].pk}/agent/").json()["silence"]["silent"]
    # A replica row's page has no Replicas table to redraw.
    assert page.get(f"/deployments/{rows[2].pk}/agent/").json()["replicas"] == []
