"""Server-sent events for one deployment, under ASGI.

A stream sends the events after `Last-Event-ID` (or ?after=), then the live ones, each
seq once and in order; a keep-alive comment after SSE_KEEPALIVE_S of quiet; it ends after
the deployment's terminal event.

The live feed (feed.py) is one Redis reader per deployment and process, shared by all its
streams; a stream is only a place in what it read (streams.py). Each stream's socket holds
at most STREAM_UNSENT_BYTES unsent in the kernel (with_stream_sockets): without that
bound, a loopback or LAN socket of a client that stopped reading takes up to 4 MiB (the
kernel's send buffer, autotuned) before its sends wait, 5 s of a busy engine written to
every background tab at the full rate (docs/performance.md, Live viewers).

No stream holds a database connection while it waits: each read is one short call on a
worker thread that hands its connection back (to the pool) before returning.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_safe

from .feed import REDIS_RETRY_S, feed_for
from .models import Deployment
from .permissions import can_view
from .prom import SSE_CLIENTS
from .streams import MAX_SEQ, Stream

log = logging.getLogger(__name__)

STREAM_UNSENT_BYTES = 2**16  # what an event stream's socket holds unsent in the kernel
KEEPALIVE = b": keep-alive\n\n"


def _start_seq(request: HttpRequest) -> int:
    """Where a stream resumes: Last-Event-ID (or ?after=); one that is no seq (not a number,
    negative, past any bigint) replays from the start instead of failing the stream."""
    raw = (request.headers.get("Last-Event-ID") or request.GET.get("after") or "0").strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_SEQ:
        return 0
    return int(raw)


# ------------------------------------------------------------------ the view

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
_STREAM_PATH = re.compile(r"/deployments/\d+/events/stream/\Z")


def with_stream_sockets(app: ASGIApp) -> ASGIApp:
    """The ASGI app, with each event stream's socket bounded to STREAM_UNSENT_BYTES unsent
    in the kernel (TCP_NOTSENT_LOWAT): a client that stops reading then makes its stream's
    sends wait after that much, not after the kernel's autotuned send buffer (up to 4 MiB
    here, 5 s of a busy engine, written to every background tab at the full rate while the
    other viewers waited). Data sent and not yet acknowledged is not counted, so a reading
    client's throughput is not capped by it."""

    async def application(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _STREAM_PATH.search(scope["path"]):
            stream_socket_bound(send)
        await app(scope, receive, send)

    return application


def stream_socket_bound(send: Any) -> bool:
    """Bound the unsent bytes of the socket that `send` writes to, where the server says
    which that is (uvicorn's cycle keeps its transport); whether it was bounded."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or not hasattr(socket, "TCP_NOTSENT_LOWAT"):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, STREAM_UNSENT_BYTES)
    except OSError:  # not TCP (a Unix socket behind a proxy): the proxy buffers, not us
        return False
    return True



@require_safe
async def deployment_event_stream(
    request: HttpRequest, pk: int
) -> HttpResponse | StreamingHttpResponse:
    refusal = await sync_to_async(_refusal)(request, pk)
    if refusal is not None:
        return refusal
    response = StreamingHttpResponse(
        _events(pk, _start_seq(request)), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _refusal(request: HttpRequest, pk: int) -> HttpResponse | None:
    """The session and the deployment, in one short stay on the request's connection."""
    try:
        if not request.user.is_authenticated:
            return HttpResponse(
                "Log in to follow a deployment.", status=401, content_type="text/plain")
        if not can_view(request.user):
            return HttpResponse("You need the viewer role to follow a deployment.",
                                status=403, content_type="text/plain")
        if not Deployment.objects.filter(pk=pk).exists():
            return HttpResponse("No such deployment.", status=404, content_type="text/plain")
        return None
    finally:
        connection.close()


def _release_connection() -> None:
    # Django hands the request's connection back only when the response ends, and not at
    # all when a streaming body raises; a stream lasts hours, so it gives it back now.
    connection.close()


async def _events(pk: int, last: int) -> AsyncIterator[bytes]:
    await sync_to_async(_release_connection)()
    yield b"retry: 2000\n\n"
    stream = Stream(pk, last)
    SSE_CLIENTS.inc()
    try:
        while not stream.ended:
            before = stream.last
            async with aclosing(_follow(stream)) as chunks:
                async for data in chunks:
                    yield data
            if stream.last == before and not stream.ended:
                await asyncio.sleep(REDIS_RETRY_S)  # a failing feed is not retried in a spin
    except Exception:
        # Ending the body cleanly lets the browser reconnect (Last-Event-ID) as after any
        # end; an exception here would also skip Django's end-of-request cleanup.
        log.exception("event stream of deployment %s failed", pk)
    finally:
        SSE_CLIENTS.dec()


async def _follow(stream: Stream) -> AsyncGenerator[bytes, None]:
    """What the feed has for this stream, as it comes, until the end (or the feed's); a
    keep-alive when the feed says its deployment was quiet for SSE_KEEPALIVE_S."""
    feed = feed_for(stream.pk)
    viewer = feed.attach()
    try:
        await asyncio.shield(feed.ready)
        while not stream.ended and not feed.closed:
            data = await feed.chunk_for(stream, viewer)
            if not data and not (await viewer.wait() and not feed.closed):
                continue
            yield data or KEEPALIVE
    finally:
        feed.detach(viewer)


