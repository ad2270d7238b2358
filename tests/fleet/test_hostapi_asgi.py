"""The host API's ingest answered before Django (web/fleet/asgi.py) gives the answers
Django's view gives: the same status, JSON body and headers for every refusal and for a
stored batch, and it stores what the view stores. What it must leave to Django (a Host
header Django refuses) reaches Django."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.rows import ready
from web.asgitypes import ASGIApp
from web.deployments.models import Event
from web.fleet import services
from web.fleet.asgi import HostIngest
from web.fleet.models import FleetHost, Placement
from web.serving import django_application

from .hosts import joined

pytestmark = pytest.mark.django_db(transaction=True)

# The answer's headers that say when or how big it was, not what it is.
_VARYING = {b"date", b"server", b"content-length"}


class Counted:
    """Django's ASGI app, counting the requests it answered."""

    def __init__(self) -> None:
        self.app = django_application()
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


def _call(app: ASGIApp, path: str, body: bytes, headers: dict[str, str]) -> tuple[
        int, dict[bytes, bytes], bytes]:
    sent_headers = {"host": "testserver", "content-type": "application/json",
                    "content-length": str(len(body)),
                    **{name.lower(): value for name, value in headers.items()}}
    raw = [(name.encode(), value.encode()) for name, value in sent_headers.items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": raw,
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=30))
    start = sent[0]
    answer = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.lower(): v for k, v in start["headers"]}, answer


def _both(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    """The same request to the ingest before Django and to Django alone: equal answers."""
    django = Counted()
    fast = HostIngest(django)
    status, got_headers, got = _call(fast, path, body, headers)
    assert django.calls == 0, "the ingest left the request to Django"
    django_status, django_headers, django_body = _call(django, path, body, headers)
    assert (status, json.loads(got)) == (django_status, json.loads(django_body))
    assert ({k: v for k, v in got_headers.items() if k not in _VARYING}
            == {k: v for k, v in django_headers.items() if k not in _VARYING})
    return status, json.loads(got)


def _place(deployment: Any, host: str) -> None:
    """The deployment placed on `host` alone (whatever placed it before)."""
    Placement.objects.filter(deployment=deployment).delete()
    services.placement_assign(deployment=deployment, host_name=host)


def _batch(texts: list[str], **fields: Any) -> bytes:
    return json.dumps({"events": [["log", {"stream": "stdout", "text": t}] for t in texts],
                       **fields}).encode()


def test_the_ingest_before_django_refuses_as_the_view_does(live_channel, settings) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    joined("gpu-3")
    mine = ready()
    mine.start_token = "s1"
    mine.save(update_fields=["start_token"])
    _place(mine, "gpu-2")
    theirs = ready(name="second", gpus=[1])
    _place(theirs, "gpu-3")
    path = f"/api/fleet/host/deployments/{mine.pk}/events/"
    bearer = {"Authorization": f"Bearer {done.credential}"}
    good = _batch(["x"], start_token="s1")

    status, body = _both(path, good, {})
    assert status == 401 and "Bearer sdh-" in body["detail"]
    status, body = _both(path, good, {"Authorization": "Bearer sdh-not-a-host"})
    assert status == 401 and "join again" in body["detail"]
    status, body = _both(path, b"{not json", bearer)
    assert status == 400 and "not JSON" in body["detail"]
    status, body = _both(path, b"[1]", bearer)
    assert status == 400 and "JSON object" in body["detail"]
    status, body = _both(path, json.dumps({"events": [["status", {"message": "x"}]]}).encode(),
                         bearer)
    assert status == 400 and "status" in body["events"][0]
    status, body = _both(f"/api/fleet/host/deployments/{theirs.pk}/events/", good, bearer)
    assert status == 404 and "placed on it" in body["detail"]
    status, body = _both("/api/fleet/host/deployments/99999999999/events/", good, bearer)
    assert status == 404
    status, body = _both(path, _batch(["x"], start_token="s0"), bearer)
    assert status == 409 and "no longer on that start" in body["detail"]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64
    status, body = _both(path, _batch(["x" * 100], start_token="s1"), bearer)
    assert status == 413 and "APPLIANCE_MAX_BODY_BYTES" in body["detail"]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
    FleetHost.objects.filter(name="gpu-2").update(
        agent_session="another", agent_lease_until=timezone.now() + timedelta(seconds=30))
    status, body = _both(path, good, {**bearer, "X-Agent-Session": "mine"})
    assert status == 409 and "another agent process" in body["detail"]
    assert not Event.objects.filter(deployment=mine, kind="log").exists()
    assert not Event.objects.filter(deployment=theirs, kind="log").exists()


def test_the_ingest_before_django_stores_a_batch_once(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    _place(mine, "gpu-2")
    path = f"/api/fleet/host/deployments/{mine.pk}/events/"
    bearer = {"Authorization": f"Bearer {done.credential}"}
    mine.refresh_from_db()
    base = mine.last_seq  # the panel's own events of its start
    django = Counted()
    fast = HostIngest(django)
    first = _batch(["line 0", "line 1"], row={"log_cursor": "c1"}, after="")
    status, headers, body = _call(fast, path, first, bearer)
    assert status == 200 and json.loads(body) == {"last_seq": base + 2, "stored": True}
    assert headers[b"content-type"] == b"application/json"
    # The same batch again (its answer lost): not stored twice, the row's cursor answered;
    # Django's view answers it the same.
    again = [_call(app, path, first, bearer) for app in (fast, django)]
    assert [(s, json.loads(b)) for s, _, b in again] == [
        (200, {"last_seq": base + 2, "stored": False, "log_cursor": "c1"})] * 2
    status, _, body = _call(fast, path, _batch(["line 2"], row={"log_cursor": "c2"},
                                               after="c1"), bearer)
    assert status == 200 and json.loads(body)["last_seq"] == base + 3
    assert django.calls == 1  # the one sent to Django itself
    texts = [e.payload["text"]
             for e in Event.objects.filter(deployment=mine, kind="log").order_by("seq")]
    assert texts == ["line 0", "line 1", "line 2"]
    mine.refresh_from_db()
    assert mine.log_cursor == "c2"


def test_a_host_header_django_refuses_is_left_to_django(live_channel) -> None:  # type: ignore[no-untyped-def]
    done = joined("gpu-2")
    mine = ready()
    _place(mine, "gpu-2")
    django = Counted()
    path = f"/api/fleet/host/deployments/{mine.pk}/events/"
    status, _, _ = _call(HostIngest(django), path, _batch(["x"]),
                         {"Host": "evil.example", "Authorization": f"Bearer {done.credential}"})
    assert django.calls == 1 and status == 400
    assert not Event.objects.filter(deployment=mine, kind="log").exists()
