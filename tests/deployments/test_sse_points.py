"""Metric points ride the deployment's SSE stream live, without ids, between events."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from tests.servers import login_session, panel_server
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import live, services

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(tmp_path: Path, live_channel):  # type: ignore[no-untyped-def]
    with panel_server(tmp_path / "uvicorn.log", APPLIANCE_SSE_KEEPALIVE_S="3") as url:
        yield url


def test_points_arrive_live_without_ids_and_events_keep_their_order(server, operator):  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    live.publish_point(pk, {"t": 1.0, "throughput": 1.0})  # before the stream: not replayed
    session = login_session(server, "otto", "operator-pass-1")

    def later() -> None:
        time.sleep(1.5)
        for i in range(12):  # points only for longer than the keep-alive (3 s)
            live.publish_point(pk, {"t": 10.0 + i, "throughput": 300.0 + i})
            time.sleep(0.4)
            if i == 5:
                services.events_append(deployment_id=pk, events=[("log", {"text": "between"})])
        services.deployment_stop(deployment_id=deployment.pk)
        connection.close()

    threading.Thread(target=later).start()
    frames: list[tuple[str | None, dict]] = []  # type: ignore[type-arg]
    last_id = None
    with session.get(f"{server}/deployments/{pk}/events/stream/", stream=True, timeout=30) as resp:
        for raw in resp.iter_lines(decode_unicode=True):
            if raw.startswith("id: "):
                last_id = raw[4:]
            elif raw.startswith("data: "):
                frames.append((last_id, json.loads(raw[6:])))
                last_id = None
                if frames[-1][1]["kind"] == "end":
                    break
    points = [body["payload"]["t"] for frame_id, body in frames if body["kind"] == "point"]
    assert points == [10.0 + i for i in range(12)]
    assert all(frame_id is None for frame_id, body in frames if body["kind"] == "point")
    events = [body for frame_id, body in frames if body["kind"] != "point"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert any(e["payload"].get("text") == "between" for e in events)
    # The log line came between the sixth and seventh point, not after them all.
    kinds = [body["kind"] if body["kind"] == "point" else body["payload"].get("text")
             for _, body in frames]
    assert kinds.index("between") < len(kinds) - 3
