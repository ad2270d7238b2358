"""Server-sent events for one deployment, under ASGI.

Replays from the database (the record) after `Last-Event-ID`, then follows the
Redis stream (the live channel); fills any gap from the database; sends
keep-alive comments; ends after the deployment's terminal event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from . import live, selectors
from .models import Deployment, Event

REPLAY_PAGE = 500


def sse_frame(event: dict[str, Any]) -> str:
    return f"id: {event['seq']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def _start_seq(request: HttpRequest) -> int:
    raw = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


async def deployment_event_stream(
    request: HttpRequest, pk: int
) -> HttpResponse | StreamingHttpResponse:
    user = await request.auser()
    if not user.is_authenticated:
        return HttpResponse("Log in to follow a deployment.", status=401, content_type="text/plain")
    if not await Deployment.objects.filter(pk=pk).aexists():
        return HttpResponse("No such deployment.", status=404, content_type="text/plain")
    response = StreamingHttpResponse(
        _events(pk, _start_seq(request)), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _from_db(pk: int, after: int, upto: int | None = None) -> list[Event]:
    events = await sync_to_async(selectors.events_after)(
        deployment_id=pk, after_seq=after, limit=REPLAY_PAGE
    )
    return [e for e in events if upto is None or e.seq <= upto]


async def _events(pk: int, last: int) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    state = {"last": last, "ended": False}
    async for frame in _replay(pk, state):
        yield frame
    if state["ended"]:
        return
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        async for frame in _follow(pk, state, client):
            yield frame
    finally:
        await client.aclose()


async def _replay(pk: int, state: dict[str, Any], upto: int | None = None) -> AsyncIterator[str]:
    while True:
        events = await _from_db(pk, state["last"], upto)
        for event in events:
            yield sse_frame(event.to_wire())
            state["last"] = event.seq
            if event.kind == "end":
                state["ended"] = True
                return
        if len(events) < REPLAY_PAGE:
            return


async def _follow(pk: int, state: dict[str, Any], client: aioredis.Redis) -> AsyncIterator[str]:
    key = live.stream_key(pk)
    block_ms = max(1, settings.SSE_KEEPALIVE_S) * 1000
    while not state["ended"]:
        reply: Any = await client.xread(
            {key: f"0-{state['last']}"}, block=block_ms, count=200
        )
        if not reply:
            yield ": keep-alive\n\n"
            # Anything that missed the live channel is still in the record.
            async for frame in _replay(pk, state):
                yield frame
            continue
        for entry_id, fields in reply[0][1]:
            async for frame in _deliver(pk, state, live.seq_of(entry_id), fields):
                yield frame
            if state["ended"]:
                return


async def _deliver(
    pk: int, state: dict[str, Any], seq: int, fields: dict[bytes, bytes]
) -> AsyncIterator[str]:
    if seq <= state["last"]:
        return
    if seq > state["last"] + 1:  # the stream was trimmed or an entry lost a race
        async for frame in _replay(pk, state, upto=seq - 1):
            yield frame
        if state["ended"] or seq <= state["last"]:
            return
    event = json.loads(fields[b"data"])
    yield sse_frame(event)
    state["last"] = seq
    if event.get("kind") == "end":
        state["ended"] = True
