"""The SSE endpoint under a real ASGI server (uvicorn), real PostgreSQL and Redis."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import requests
from django.db import connection

from appliance.lifecycle import Process
from tests.servers import login_session, panel_server
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services

pytestmark = pytest.mark.django_db(transaction=True)


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
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    response = requests.get(f"{server}/deployments/{deployment.pk}/events/stream/", timeout=5)
    assert response.status_code in {302, 401}


def test_it_replays_then_streams_live_and_ends(server, operator):  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    session = login_session(server, "otto", "operator-pass-1")
    services.deployment_mark_starting(deployment_id=pk, image="img")

    def later() -> None:
        time.sleep(1.5)  # the stream is following the live feed by then
        services.events_append(deployment_id=pk, events=[("log", {"text": "live line"})])
        services.deployment_mark_stopping(deployment_id=pk)
        services.deployment_mark_stopped(deployment_id=pk)
        connection.close()

    threading.Thread(target=later).start()
    with session.get(f"{server}/deployments/{pk}/events/stream/", stream=True, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events, comments = _read_events(resp, "end")
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert any(e["payload"].get("text") == "live line" for e in events)
    assert events[-1]["kind"] == "end" and events[-1]["payload"]["status"] == "stopped"


def test_it_resumes_after_last_event_id_from_the_database(server, operator, live_channel):  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    services.events_append(deployment_id=pk, events=[("log", {"text": f"l{i}"}) for i in range(5)])
    live_channel.delete(f"appliance:deployment:{pk}:events")  # the live channel lost everything
    services.deployment_stop(deployment_id=deployment.pk)
    session = login_session(server, "otto", "operator-pass-1")
    headers = {"Last-Event-ID": "3"}
    with session.get(
        f"{server}/deployments/{pk}/events/stream/", stream=True, timeout=30, headers=headers
    ) as resp:
        events, _ = _read_events(resp, "end")
    assert events[0]["seq"] == 4
    assert [e["seq"] for e in events] == list(range(4, 4 + len(events)))
    assert events[-1]["kind"] == "end"


def _timed_lines(response: requests.Response, until_kind: str, limit_s: float) -> list[tuple[float, str]]:
    """(seconds since the call, line) for each non-empty line, up to an event of until_kind."""
    started = time.monotonic()
    lines = []
    for raw in response.iter_lines(decode_unicode=True):
        if raw:
            lines.append((time.monotonic() - started, raw))
        if raw.startswith("data: ") and json.loads(raw[6:])["kind"] == until_kind:
            break
        if time.monotonic() - started > limit_s:
            break
    return lines


def test_a_quiet_stream_gets_keepalives_and_stays_open(server, operator):  # type: ignore[no-untyped-def]
    # The production keep-alive (15 s) is longer than redis-py's default socket timeout
    # (5 s): a stream quiet for longer must neither break nor miss the keep-alive.
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    session = login_session(server, "otto", "operator-pass-1")
    quiet_s = 21

    def later() -> None:
        time.sleep(quiet_s)
        services.events_append(deployment_id=pk, events=[("log", {"text": "after the quiet"})])
        services.deployment_mark_stopped(deployment_id=pk, by=Process.WEB)  # still queued
        connection.close()

    threading.Thread(target=later).start()
    with session.get(f"{server}/deployments/{pk}/events/stream/", stream=True, timeout=30) as resp:
        lines = _timed_lines(resp, "end", limit_s=40)
    keepalives = [at for at, line in lines if line.startswith(": keep-alive")]
    events = [json.loads(line[6:]) for _, line in lines if line.startswith("data: ")]
    assert any(e["payload"].get("text") == "after the quiet" for e in events)
    assert events[-1]["kind"] == "end"  # on the same connection: it never dropped
    assert keepalives and 14 <= keepalives[0] <= 20
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def test_open_streams_hold_no_database_connection(tmp_path, live_channel, operator, token_for):  # type: ignore[no-untyped-def]
    # A pool of 2 and more streams than that: a stream that kept its connection while it
    # waits would leave none for the rest, and for the API.
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    token = token_for(operator)
    env = {"APPLIANCE_DB_POOL_MAX_SIZE": "2", "PGAPPNAME": "sse-pool-test"}
    with panel_server(tmp_path / "uvicorn.log", **env) as url:
        session = login_session(url, "otto", "operator-pass-1")
        streams = [session.get(f"{url}/deployments/{pk}/events/stream/", stream=True, timeout=30)
                   for _ in range(6)]
        lines = [s.iter_lines(decode_unicode=True) for s in streams]
        for it in lines:
            assert next(it).startswith("retry:")
        summary = requests.get(f"{url}/api/deployments/{pk}/summary/", timeout=5,
                               headers={"Authorization": f"Token {token}"})
        assert summary.status_code == 200
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           ["sse-pool-test"])
            assert cursor.fetchone()[0] <= 2
        services.events_append(deployment_id=pk, events=[("log", {"text": "to all"})])
        for it in lines:
            texts = []
            for raw in it:
                if raw.startswith("data: "):
                    texts.append(json.loads(raw[6:])["payload"].get("text"))
                    if texts[-1] == "to all":
                        break
            assert texts[-1] == "to all"
        for stream in streams:
            stream.close()


def test_many_viewers_get_every_event_once_in_order_across_live_gaps(server, operator):  # type: ignore[no-untyped-def]
    from unittest import mock

    from web.deployments import live, selectors

    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    session = login_session(server, "otto", "operator-pass-1")
    results: dict[int, list[int]] = {}

    def viewer(n: int, after: int) -> None:
        own = requests.Session()  # one per thread; the login's cookie
        own.cookies.update(session.cookies)
        headers = {"Last-Event-ID": str(after)}
        with own.get(f"{server}/deployments/{pk}/events/stream/", stream=True,
                         timeout=30, headers=headers) as resp:
            events, _ = _read_events(resp, "end", limit_s=30)
        results[n] = [e["seq"] for e in events]

    threads = [threading.Thread(target=viewer, args=(n, 0)) for n in range(12)]
    for thread in threads:
        thread.start()
    time.sleep(1)
    for batch in range(20):
        if batch == 5:  # a viewer that joins late, from an earlier event
            late = threading.Thread(target=viewer, args=(99, 3))
            late.start()
            threads.append(late)
        if batch in {8, 9}:  # these never reach the live channel (a failed publish)
            with mock.patch.object(live, "publish"):
                services.events_append(deployment_id=pk, events=[("log", {"text": "x"})] * 5)
        else:
            services.events_append(deployment_id=pk, events=[("log", {"text": "y"})] * 5)
        time.sleep(0.05)
    services.deployment_mark_stopped(deployment_id=pk, by=Process.WEB)  # still queued
    for thread in threads:
        thread.join(timeout=40)
    last = selectors.events_after(deployment_id=pk, after_seq=0, limit=1000)[-1].seq
    assert results.pop(99) == list(range(4, last + 1))
    assert len(results) == 12
    for seqs in results.values():
        assert seqs == list(range(1, last + 1))


def _open_stalled(url: str, path: str, cookie: str, after: int) -> socket.socket:
    """A stream that a client opens, reads the headers of, then stops reading (a background
    tab on a slow link: a small receive window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    host = url.removeprefix("http://")
    sock.connect(("127.0.0.1", int(host.rsplit(":", 1)[1])))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\nAccept: text/event-"
                 f"stream\r\nLast-Event-ID: {after}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def _read_body_until(sock: socket.socket, last: int, limit_s: float = 60) -> bytes:
    """The chunked body's data from here until the event `last` (the chunking undone)."""
    sock.settimeout(limit_s)
    raw = b""
    body = b""
    while f"id: {last}\n".encode() not in body:
        raw += sock.recv(1 << 16)
        while (eol := raw.find(b"\r\n")) >= 0:
            size = int(raw[:eol], 16)
            if len(raw) < eol + 2 + size + 2:
                break
            body += raw[eol + 2:eol + 2 + size]
            raw = raw[eol + 2 + size + 2:]
    return body


def test_a_client_that_stops_reading_holds_little_of_the_stream_then_catches_up_told_so(server, operator):  # type: ignore[no-untyped-def]
    from web.deployments import feed

    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    pk = deployment.pk
    start = services.events_append(deployment_id=pk, events=[("log", {"text": "s"})])[-1].seq
    session = login_session(server, "otto", "operator-pass-1")
    cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
    path = f"/deployments/{pk}/events/stream/"
    stalled = [_open_stalled(server, path, cookie, start) for _ in range(10)]
    n = feed.RING_FRAMES + 5000
    last = start + n  # a deployment's seqs have no gaps
    fast: list[int] = []

    def follow() -> None:
        with session.get(f"{server}{path}", stream=True, timeout=60,
                         headers={"Last-Event-ID": str(start)}) as resp:
            for raw in resp.iter_lines(decode_unicode=True):
                if raw.startswith("data: "):
                    fast.append(json.loads(raw[6:])["seq"])
                    if fast[-1] >= last:
                        break

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(1)  # all attached to the feed
    # More than the feed's ring keeps (RING_FRAMES) and less than SKIP_LAG: a stream whose
    # client stopped reading catches up from the record when it reads again, told so;
    # 15,000 x ~330 bytes is more than the kernel's autotuned send buffer (4 MiB) a
    # stalled socket took before its unsent bytes were bound.
    assert n < feed.SKIP_LAG
    for _ in range(0, n, 1000):
        services.events_append(deployment_id=pk, events=[("log", {"text": "x" * 200})] * 1000)
    connection.close()
    reader.join(timeout=60)
    assert fast == list(range(start + 1, last + 1))  # the reading viewer: every event once
    for sock in stalled:
        body = _read_body_until(sock, last)
        sock.close()
        held, _, rest = body.partition(b'"kind":"behind"')
        # What the server held for it when it stopped reading, in the kernel and in the
        # process: at most a send (SEND_BYTES), the transport's buffer (its 64 KiB high
        # water and a write), the socket's unsent bytes (STREAM_UNSENT_BYTES and a write)
        # and the client's own small window: not the 4 MiB of an unbounded socket.
        assert rest and len(held) < 6 * 2**16
        told = json.loads(re.findall(rb'^data: (\{"seq":\d+,"kind":"behind".*)$', body, re.M)[0])
        assert told["payload"]["behind"] > 0 and told["payload"]["head"] <= last
        # Every event, once and in order: nothing skipped, the rest from the record.
        assert b'"kind":"skip"' not in body
        seqs = [int(s) for s in re.findall(rb"^id: (\d+)$", body, re.M)]
        assert seqs == list(range(start + 1, last + 1))
        assert told["payload"]["from"] == told["seq"] + 1 and told["seq"] in seqs
