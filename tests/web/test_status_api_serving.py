"""How the panel's ASGI app serves (web/serving.py, issue 22): a sync view (the status API,
/healthz, the pages) through Django's WSGI handler on a thread pool, an async view (the SSE
stream, the log download) through Django's ASGI handler; in process, as uvicorn calls it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator

from web.deployments import services
from web.serving import django_application, view_is_async

from .specs import spec

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(path: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None
           ) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "headers": [(b"host", b"127.0.0.1"),
                                                               *(headers or [])],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}


async def _talk(app: Any, scope: dict[str, Any], body: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
    talk = ApplicationCommunicator(app, scope)
    await talk.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await talk.receive_output(10)
    headers = {k.lower(): v for k, v in start.get("headers", [])}
    chunks = []
    while True:
        message = await talk.receive_output(10)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    await talk.wait(10)
    return start["status"], headers, b"".join(chunks)


def call(app: Any, scope: dict[str, Any], body: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
    return async_to_sync(_talk)(app, scope, body)


def test_only_the_streaming_views_are_async() -> None:
    assert view_is_async("/deployments/1/events/stream/")
    assert view_is_async("/deployments/1/log.txt")
    assert not view_is_async("/healthz")
    assert not view_is_async("/api/deployments/1/summary/")
    assert not view_is_async("/no/such/page/")  # Django's 404, from the WSGI handler


def test_a_sync_view_answers_through_the_wsgi_handler(viewer: Any, token_for: Any) -> None:
    deployment = services.deployment_create(data=spec(), confirm_warnings=True)
    auth = [(b"authorization", f"Token {token_for(viewer)}".encode())]
    app = django_application()
    status, _, body = call(app, _scope("/healthz"))
    assert status == 200 and body == b'{"ok": true}'
    url = f"/api/deployments/{deployment.pk}/"
    status, headers, body = call(app, _scope(url, headers=auth))
    assert status == 200 and b'"status":"queued"' in body and headers[b"etag"]
    status, _, body = call(app, _scope(url, headers=[*auth, (b"if-none-match", headers[b"etag"])]))
    assert status == 304 and body == b""


def test_a_request_body_reaches_a_sync_view(operator: Any, token_for: Any) -> None:
    body = json.dumps({"spec": spec()}).encode()
    status, _, answer = call(django_application(), _scope("/api/preflight/", "POST", [
        (b"authorization", f"Token {token_for(operator)}".encode()),
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]),
        body)
    assert status == 200 and json.loads(answer)["ok"] is True
