"""How the panel's ASGI app serves (web/serving.py, so that a status read polled by hundreds of
dashboards costs what a trivial view costs): a sync view (the status API, /healthz, the pages)
through Django's WSGI handler on a thread pool (WSGIBridge: a buffered answer handed back to
the loop once, a streamed one sent piece by piece), an async view (the SSE stream, the log
download) through Django's ASGI handler; in process, as uvicorn calls it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings

from tests.specs import spec
from web.deploy import services as deploying
from web.serving import WSGIBridge, django_application, view_is_async

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(path: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None
           ) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "headers": [(b"host", b"127.0.0.1"),
                                                               *(headers or [])],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}


async def _talk(app: Any, scope: dict[str, Any], body: bytes = b"") -> list[dict[str, Any]]:
    talk = ApplicationCommunicator(app, scope)
    await talk.send_input({"type": "http.request", "body": body, "more_body": False})
    messages = [await talk.receive_output(10)]
    while True:
        message = await talk.receive_output(10)
        messages.append(message)
        if not message.get("more_body"):
            break
    await talk.wait(10)
    return messages


def messages(app: Any, scope: dict[str, Any], body: bytes = b"") -> list[dict[str, Any]]:
    return async_to_sync(_talk)(app, scope, body)


def call(app: Any, scope: dict[str, Any], body: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
    start, *rest = messages(app, scope, body)
    headers = {k.lower(): v for k, v in start.get("headers", [])}
    return start["status"], headers, b"".join(m.get("body", b"") for m in rest)


def test_only_the_streaming_views_are_async() -> None:
    assert view_is_async("/deployments/1/events/stream/")
    assert view_is_async("/deployments/1/log.txt")
    assert not view_is_async("/healthz")
    assert not view_is_async("/api/deployments/1/summary/")
    assert not view_is_async("/no/such/page/")  # Django's 404, from the WSGI handler


def test_a_paths_handler_is_resolved_once() -> None:
    view_is_async("/healthz")
    before = view_is_async.cache_info()
    assert [view_is_async("/healthz") for _ in range(3)] == [False] * 3
    assert view_is_async("/deployments/90417/events/stream/")
    after = view_is_async.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (3, 1)
    assert after.maxsize == 4096  # bounded: a client picks the paths


def test_a_sync_view_answers_through_the_wsgi_handler(viewer: Any, token_for: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
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


def test_a_buffered_answer_comes_back_to_the_loop_whole() -> None:
    start, *body = messages(django_application(), _scope("/healthz"))
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"application/json") in start["headers"]
    assert body == [{"type": "http.response.body", "body": b'{"ok": true}'}]


def test_a_static_file_is_streamed_whole() -> None:
    path = settings.STATICFILES_DIRS[0] / "appliance" / "favicon.svg"
    status, headers, body = call(django_application(), _scope("/static/appliance/favicon.svg"))
    assert status == 200 and body == path.read_bytes()
    assert headers[b"content-length"] == str(len(body)).encode()


def _wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    """A plain WSGI app: write() before a streamed body, the request body echoed."""
    write = start_response("201 Created", [("Content-Type", "text/plain"), ("X-Seen", "yes ")])
    write(b"written;")
    asked = environ["wsgi.input"].read()

    def pieces() -> Any:
        yield b"one;"
        yield b"two;" + asked

    return pieces()


def test_a_wsgi_apps_write_and_streamed_pieces_arrive_in_order() -> None:
    start, *rest = messages(WSGIBridge(_wsgi_app, workers=2), _scope("/echo", "POST"), b"body")
    assert start["status"] == 201 and (b"x-seen", b"yes") in start["headers"]
    assert [m["body"] for m in rest] == [b"written;", b"one;", b"two;body", b""]
    assert [m.get("more_body", False) for m in rest] == [True, True, True, False]


def _failing_app(environ: dict[str, Any], start_response: Any) -> Any:
    raise RuntimeError("the app broke")


def test_an_app_that_raises_raises_to_the_server() -> None:
    # uvicorn answers 500 for an app that raises before its answer starts.
    with pytest.raises(RuntimeError, match="the app broke"):
        messages(WSGIBridge(_failing_app, workers=1), _scope("/"))
