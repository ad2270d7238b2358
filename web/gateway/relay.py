"""The gateway's relay: one request to a replica of its deployment, once more to another
when the first failed before answering, the client's disconnect stopping the engine's
work, and the answer passed through as the engine wrote it (web/gateway/proxy.py admits
the request and picks the deployment; the routing table picks the replica)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import zlib
from typing import Any

from django.conf import settings

from web.asgitypes import Receive, Send
from web.gateway.admission import Refusal
from web.gateway.bounds import Bounds, UpstreamError, UpstreamTimeout
from web.gateway.routing import routing
from web.gateway.selectors import Target
from web.gateway.upstream import CONNECT_TIMEOUT_S, Response, pool
from web.gateway.usage import UsageTap

log = logging.getLogger(__name__)


async def send_json(send: Send, status: int, body: Any,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(data)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def refuse(send: Send, refusal: Refusal) -> None:
    extra = ([(b"retry-after", str(refusal.retry_after).encode())]
             if refusal.retry_after is not None else [])
    if refusal.status == 401:
        extra.append((b"www-authenticate", b'Bearer realm="sd-appliance"'))
    await send_json(send, refusal.status, refusal.body(), extra)


REPLICA = b"x-appliance-replica"  # the replica (its index) that answered, or began a stream
RETRIED = (b"x-appliance-retried", b"1")  # another replica failed it before answering


async def relay_watching(receive: Receive, send: Send, target: Target, path: str,
                          body: bytes, stream: bool, tap: UsageTap,
                          data: dict[str, Any]) -> None:
    """Relay, and stop the engine's work as soon as the client goes away.

    The relay runs in the request's own task; a watcher of the client's disconnect cancels
    it. (A task of its own for the relay and `asyncio.wait` on the two cost a task, a
    waiter and four callbacks per request, on the path whose added p99 docs/gateway.md bounds.)"""
    relaying = asyncio.current_task()
    assert relaying is not None
    watching = True  # the watcher cancels the relay only while it runs
    stopped = False  # ... and says so: any other cancel is the server's, and goes on up

    def client_gone(watcher: asyncio.Future[None]) -> None:
        nonlocal stopped
        if watching and not watcher.cancelled() and watcher.exception() is None:
            stopped = True
            relaying.cancel()

    gone = asyncio.ensure_future(_disconnected(receive))
    gone.add_done_callback(client_gone)
    try:
        await _relay(send, target, path, body, stream, tap, data)
    except asyncio.CancelledError:
        if not stopped:
            raise  # cancelled from outside (the server shutting down), not by the watcher
        relaying.uncancel()  # the client went away: the relay was stopped, nothing more
    finally:
        watching = False
        if not gone.done():
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _relay(send: Send, target: Target, path: str, body: bytes, stream: bool,
                 tap: UsageTap, data: dict[str, Any]) -> None:
    """To one replica of the deployment; once more to another when the first failed before
    answering (refused, reset, a 502/503, a stream broken before its first event, nothing
    within the first-byte timeout: web/gateway/upstream.py's Bounds)."""
    table = routing()
    rows = table.rotation(target)
    if not rows:
        await refuse(send, Refusal(503, f"Every replica of {target.model!r} is draining (a "
                                    "rolling change is under way); try again shortly.",
                                    "service_unavailable", "deployment_draining"))
        return
    affinity = _affinity(data) if len(rows) > 1 else None
    tried: tuple[int, ...] = ()
    while rows:
        row = table.pick(rows, affinity=affinity)
        tried += (row.deployment_id,)
        # The one retry is owed whenever another row serves, not only when the rotation
        # offered one: a row left out of it (its host's heartbeat late, a failure of its own
        # not yet cleared by /health) is still a better answer than a 503.
        retry = len(tried) == 1 and any(t.deployment_id != row.deployment_id
                                        for t in table.serving(target))
        tap.replica = row.replica_index
        table.begin(row)
        try:
            answered = await _relay_to(send, row, path, body, stream, tap, retry)
        finally:
            table.end(row)
        if answered:
            if tap.failure is not None:  # its stream broke off midway: out until it is back
                table.eject(row, generate=isinstance(tap.failure, UpstreamTimeout))
            return
        # A replica that timed out may be one whose HTTP server answers while its engine
        # does not: it comes back only once it makes a token again.
        table.eject(row, generate=isinstance(tap.failure, UpstreamTimeout))
        if not retry:
            break
        rows = table.rotation(target, exclude=tried, away_from=row.host_key)
        if not tap.started:  # said on the answer: it came from a second replica
            tap.headers.append(RETRIED)
    timed_out = isinstance(tap.failure, UpstreamTimeout)
    if tap.started:  # a stream's head went out, no event: it ends as a broken one
        tap.broken(_stream_timed_out(tap.failure) if timed_out else STREAM_BROKEN)
    elif timed_out:
        await refuse(send, Refusal(504, f"The deployment's engine did not answer: "
                                    f"{tap.failure}. Try again shortly.", "engine_error",
                                    "engine_timeout"))
    else:
        await refuse(send, Refusal(503, "The deployment's engine did not answer; it may be "
                                    "restarting. Try again shortly.", "service_unavailable",
                                    "engine_unreachable"))


# A replica that gives one of these before any byte of an answer is tried no more for this
# request: it is going away (SGLang answers 503 while it shuts down or its scheduler is gone).
RETRIED_STATUSES = frozenset({502, 503})
FAILOVER_CONNECT_S = 2.0  # connecting, when another replica could take the request instead
AFFINITY_BLOCK = 256  # characters: the first block of a prompt, about 64 tokens


def _affinity(data: dict[str, Any]) -> int | None:
    """A hash of the prompt's first block (the completion's prompt, the chat's first
    message), the same in every panel process; None when there is no text to hash."""
    text = data.get("prompt")
    if not isinstance(text, str):
        messages = data.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        text = first.get("content") if isinstance(first, dict) else None
        if not isinstance(text, str):
            return None
    return zlib.crc32(text[:AFFINITY_BLOCK].encode("utf-8", "surrogatepass"))


async def _relay_to(send: Send, row: Target, path: str, body: bytes, stream: bool,
                    tap: UsageTap, retry: bool) -> bool:
    """Relay from one row's engine; False when it failed before answering (nothing of it
    reached the client) and `retry` says another replica may take the request."""
    url = row.engine_url.rstrip("/") + path
    timeout_s = FAILOVER_CONNECT_S if retry else CONNECT_TIMEOUT_S
    tap.failure = None
    try:
        auth = f"Bearer {row.engine_key}" if row.engine_key else ""
        async with pool().post(url, body, authorization=auth, connect_timeout_s=timeout_s,
                               bounds=_bounds(row, stream)) as upstream:
            if retry and upstream.status in RETRIED_STATUSES:
                log.warning("engine %s answered %s before any byte: another replica takes it",
                            row.engine_url, upstream.status)
                return False
            kind = upstream.headers.get("content-type", "application/json").encode()
            if stream and upstream.status == 200:
                return await _relay_stream(send, upstream, kind, tap, retry)
            if tap.started:  # a retry after a stream's head went out: no second status
                await upstream.read()
                tap.broken(STREAM_BROKEN)
                return True
            await _relay_whole(send, upstream, kind, tap)
            return True
    except UpstreamError as exc:
        log.warning("engine %s unreachable: %s", row.engine_url, exc)
        tap.failure = exc
        return False


def _bounds(row: Target, stream: bool) -> Bounds:
    """The wait allowed on the engine (settings, docs/gateway.md "Bounded waits"): a
    stream's first event within the first-byte timeout, then silences within the idle one;
    a whole answer past the first-byte timeout only while the engine's /health answers, to
    the whole-answer timeout."""
    first, idle = settings.GATEWAY_FIRST_BYTE_TIMEOUT_S, settings.GATEWAY_IDLE_STREAM_TIMEOUT_S
    if stream:
        return Bounds(first_byte_s=first, idle_s=idle)
    return Bounds(first_byte_s=first, idle_s=idle,
                  health_url=row.engine_url.rstrip("/") + "/health",
                  whole_s=max(first, settings.GATEWAY_WHOLE_ANSWER_TIMEOUT_S))


async def _relay_stream(send: Send, upstream: Response, kind: bytes,
                        tap: UsageTap, retry: bool = False) -> bool:
    if not tap.started:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", kind), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"), *tap.headers,
            (REPLICA, str(tap.replica).encode())]})
        tap.started = True
    try:
        async for data in upstream.chunks():
            out = tap.feed(data)
            if out:
                tap.sent_body = True
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except UpstreamError as exc:
        if not tap.sent_body:  # nothing of it reached the client: another may take it
            log.warning("engine stream broken off before its first event: %s", exc)
            tap.restart()
            tap.failure = exc
            if retry:
                return False
            tap.broken(_stream_timed_out(exc) if isinstance(exc, UpstreamTimeout)
                       else STREAM_BROKEN)
            return True
        log.warning("engine stream broken off: %s", exc)
        tap.failure = exc
        tap.broken(_stream_timed_out(exc) if isinstance(exc, UpstreamTimeout)
                   else STREAM_BROKEN)
        return True
    if not tap.done:  # ended cleanly, but short of its [DONE]: the engine stopped early
        if retry and not tap.sent_body:
            tap.restart()
            return False
        log.warning("engine stream ended without [DONE]")
        tap.broken(STREAM_BROKEN)
    # the end (any unterminated tail) goes out in tap.finish, after usage is recorded
    return True


STREAM_BROKEN = Refusal(502, "The deployment's engine stopped in the middle of this answer "
                        "(it may have crashed or be restarting): the text above is "
                        "incomplete. Try again shortly.", "engine_error", "engine_stream_broken")


def _stream_timed_out(error: UpstreamError | None) -> Refusal:
    """A stream's end when its engine went silent past the gateway's bound (the error event
    names which), so the client raises instead of waiting without end."""
    return Refusal(504, f"The deployment's engine stopped answering: {error}. The text "
                   "above (if any) is incomplete. Try again shortly.", "engine_error",
                   "engine_timeout")


async def _relay_whole(send: Send, upstream: Response, kind: bytes,
                       tap: UsageTap) -> None:
    data = await upstream.read()
    if upstream.status == 200:
        with contextlib.suppress(ValueError, AttributeError):
            tap.take_usage(json.loads(data).get("usage"))
    await send({"type": "http.response.start", "status": upstream.status, "headers": [
        (b"content-type", kind), (b"content-length", str(len(data)).encode()),
        *tap.headers, (REPLICA, str(tap.replica).encode())]})
    tap.started = True
    tap.hold(data)  # sent by tap.finish, once usage is recorded
