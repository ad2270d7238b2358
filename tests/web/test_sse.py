"""The SSE endpoint under a real ASGI server (uvicorn), real PostgreSQL and Redis."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.servers import panel_server
from web.deployments import services

from .specs import spec

pytestmark = pytest.mark.django_db(transaction=True)


def _session(url: str, username: str, password: str) -> requests.Session:
    session = requests.Session()
    page = session.get(f"{url}/login/")
    token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    answer = session.post(
        f"{url}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/login/"},
    )
    assert answer.status_code == 200 and "Log out" in answer.text
    return session


def _read_events(response: requests.Response, until_kind: str, limit_s: float = 20) -> tuple[list[dict], list[str]]:  # type: ignore[type-arg]
    events: list[dict] = []  # type: ignore[type-arg]
    comments: list[str] = []
    deadline = time.monotonic() + limit_s
    for raw in response.iter_lines(decode_unicode=True):
        if raw.startswith(":"):
            comments.append(raw)
        elif raw.startswith("data: "):
            events.append(json.loads(raw[6:]))
            if events[-1]["kind"] == until_kind:
                break
        if time.monotonic() > deadline:
            break
    return events, comments


@pytest.fixture
def server(tmp_path: Path, live_channel):  # type: ignore[no-untyped-def]
    with panel_server(tmp_path / "uvicorn.log") as url:
        yield url


def test_it_refuses_an_anonymous_stream(server):  # type: ignore[no-untyped-def]
    deployment = services.deployment_create(data=spec(), confirm_warnings=True)
    response = requests.get(f"{server}/deployments/{deployment.pk}/events/stream/", timeout=5)
    assert response.status_code in {302, 401}


def test_it_replays_then_streams_live_with_keepalives_and_ends(server, operator):  # type: ignore[no-untyped-def]
    deployment = services.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    session = _session(server, "otto", "operator-pass-1")
    services.deployment_mark_starting(deployment_id=pk, image="img")

    def later() -> None:
        time.sleep(1.5)  # past one keep-alive
        services.events_append(deployment_id=pk, events=[("log", {"text": "live line"})])
        services.deployment_mark_stopping(deployment_id=pk)
        services.deployment_mark_stopped(deployment_id=pk)

    threading.Thread(target=later).start()
    with session.get(f"{server}/deployments/{pk}/events/stream/", stream=True, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events, comments = _read_events(resp, "end")
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert any(e["payload"].get("text") == "live line" for e in events)
    assert events[-1]["kind"] == "end" and events[-1]["payload"]["status"] == "stopped"
    assert any(c.startswith(": keep-alive") for c in comments)


def test_it_resumes_after_last_event_id_from_the_database(server, operator, live_channel):  # type: ignore[no-untyped-def]
    deployment = services.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    services.events_append(deployment_id=pk, events=[("log", {"text": f"l{i}"}) for i in range(5)])
    live_channel.delete(f"appliance:deployment:{pk}:events")  # the live channel lost everything
    services.deployment_request_stop(deployment=deployment)
    session = _session(server, "otto", "operator-pass-1")
    headers = {"Last-Event-ID": "3"}
    with session.get(
        f"{server}/deployments/{pk}/events/stream/", stream=True, timeout=30, headers=headers
    ) as resp:
        events, _ = _read_events(resp, "end")
    assert events[0]["seq"] == 4
    assert [e["seq"] for e in events] == list(range(4, 4 + len(events)))
    assert events[-1]["kind"] == "end"
