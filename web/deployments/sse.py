"""Server-sent events for one deployment, under ASGI.

A stream replays from the database (the record) after `Last-Event-ID`, then follows
the deployment's live feed; fills any gap from the database; sends a keep-alive comment
after SSE_KEEPALIVE_S of quiet; ends after the deployment's terminal event.

The live feed is one Redis reader per deployment and process (an asyncio task), shared
by all its streams: it frames each event once and hands the bytes to every stream's
backlog, so a stream's own cost per event is one write. A stream whose backlog passes
BACKLOG_FRAMES (a slow client) is dropped from the feed and catches up from the database,
then joins again.

Metric points ride along (frames.py): the feed reads the deployment's points stream in
the same XREAD and passes them on without an id; they are never replayed.

No stream holds a database connection while it waits: each read is one short call on a
worker thread that hands its connection back (to the pool) before returning.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import redis
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_safe

from . import live, selectors
from .frames import POINT, Frame, entry_frame, event_frame, point_frame
from .frames import text as _text
from .models import Deployment
from .permissions import can_view
from .prom import SSE_CLIENTS

log = logging.getLogger(__name__)

REPLAY_PAGE = 500
FEED_COUNT = 500  # entries per XREAD
BACKLOG_FRAMES = 2000  # a stream further behind than this catches up from the database
RECENT_FRAMES = 500  # what a feed keeps for streams that join it a little behind
REDIS_RETRY_S = 1.0  # while Redis fails, a feed polls the database this often
KEEPALIVE = b": keep-alive\n\n"


MAX_SEQ = 2**63 - 1  # an event seq is a PostgreSQL bigint; Redis ids stop there too


def _start_seq(request: HttpRequest) -> int:
    """Where a stream resumes: Last-Event-ID (or ?after=); one that is no seq (not a number,
    negative, past any bigint) replays from the start instead of failing the stream."""
    raw = (request.headers.get("Last-Event-ID") or request.GET.get("after") or "0").strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_SEQ:
        return 0
    return int(raw)


# ------------------------------------------------------------------ the view


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


def _db_frames(pk: int, after: int, upto: int | None) -> list[Frame]:
    """One page of the record after `after` (up to `upto`), framed; on a worker thread."""
    try:
        events = selectors.events_after(deployment_id=pk, after_seq=after, limit=REPLAY_PAGE)
    finally:
        connection.close()
    return [event_frame(e.to_wire()) for e in events if upto is None or e.seq <= upto]


async def _from_db(pk: int, after: int, upto: int | None = None) -> list[Frame]:
    # Off the request's thread: the default executor's few threads also cap how many
    # streams read the database at once.
    return await sync_to_async(_db_frames, thread_sensitive=False)(pk, after, upto)


# ---------------------------------------------------------------- one stream


class _Stream:
    """One client's position: it sends each seq once, in order, up to the end."""

    def __init__(self, pk: int, last: int) -> None:
        self.pk = pk
        self.last = last
        self.ended = False

    async def replay(self, upto: int | None = None) -> AsyncIterator[list[bytes]]:
        """The record after `last` (up to `upto`), a page at a time."""
        while not self.ended:
            frames = await _from_db(self.pk, self.last, upto)
            yield self.take(frames)
            if len(frames) < REPLAY_PAGE:
                return

    def take(self, frames: list[Frame]) -> list[bytes]:
        """Those of frames that come next, in order (the caller saw to any gap)."""
        out = []
        for frame in frames:
            if self.ended or frame.seq <= self.last:
                continue
            out.append(frame.data)
            self.last = frame.seq
            self.ended = frame.end
        return out

    async def deliver(self, frames: list[Frame]) -> list[bytes]:
        """Frames from the feed; a gap before one (a stream that joined behind the feed,
        an entry that lost a race) is filled from the record first."""
        out: list[bytes] = []
        for frame in frames:
            if frame.seq == POINT:
                if not self.ended:
                    out.append(frame.data)
                continue
            if not self.ended and frame.seq > self.last + 1:
                async for page in self.replay(upto=frame.seq - 1):
                    out.extend(page)
            out.extend(self.take([frame]))
        return out


async def _events(pk: int, last: int) -> AsyncIterator[bytes]:
    await sync_to_async(_release_connection)()
    yield b"retry: 2000\n\n"
    stream = _Stream(pk, last)
    SSE_CLIENTS.inc()
    try:
        while not stream.ended:
            async for page in stream.replay():
                if page:
                    yield b"".join(page)
            if stream.ended:
                return
            before = stream.last
            async with aclosing(_follow(stream)) as live_frames:
                async for data in live_frames:
                    yield data
            if stream.last == before:
                await asyncio.sleep(REDIS_RETRY_S)  # a failing feed is not retried in a spin
    except Exception:
        # Ending the body cleanly lets the browser reconnect (Last-Event-ID) as after any
        # end; an exception here would also skip Django's end-of-request cleanup.
        log.exception("event stream of deployment %s failed", pk)
    finally:
        SSE_CLIENTS.dec()


async def _follow(stream: _Stream) -> AsyncGenerator[bytes, None]:
    """Frames from the live feed until the end, or until the feed drops this stream."""
    viewer = _feed_for(stream.pk, stream.last).attach(stream.last)
    try:
        while not stream.ended:
            frames = await viewer.next_frames(max(1, settings.SSE_KEEPALIVE_S))
            if frames is None:
                return  # dropped: catch up from the record, then join again
            data = await stream.deliver(frames) if frames else [KEEPALIVE]
            if data:
                yield b"".join(data)
    finally:
        viewer.detach()


# ------------------------------------------------------------- the live feed


class _Viewer:
    """A stream's place in a feed: the frames it has yet to send, and a way to wake it."""

    def __init__(self, feed: _Feed, frames: list[Frame]) -> None:
        self.feed = feed
        self.backlog = frames
        self.dropped = False
        self.waiter: asyncio.Future[None] | None = None

    def push(self, frames: list[Frame]) -> None:
        if len(self.backlog) + len(frames) > BACKLOG_FRAMES:
            self.drop()
            return
        self.backlog.extend(frames)
        self.wake()

    def drop(self) -> None:
        self.dropped = True
        self.feed.viewers.discard(self)
        self.wake()

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_frames(self, keepalive_s: float) -> list[Frame] | None:
        """The frames so far; [] after keepalive_s with none; None once dropped."""
        if not self.backlog and not self.dropped:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(keepalive_s):
                    await self.waiter
            except TimeoutError:
                return []
            finally:
                self.waiter = None
        frames, self.backlog = self.backlog, []
        return frames if frames or not self.dropped else None

    def detach(self) -> None:
        self.feed.detach(self)


# The feeds of the running event loop (uvicorn runs one per process), by deployment.
_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _Feed]] = (
    weakref.WeakKeyDictionary())


def _feed_for(pk: int, last: int) -> _Feed:
    feeds = _feeds.setdefault(asyncio.get_running_loop(), {})
    feed = feeds.get(pk)
    if feed is None:
        feed = feeds[pk] = _Feed(pk, last, feeds)
    return feed


class _Feed:
    """Reads one deployment's Redis stream for every stream of it in this process."""

    def __init__(self, pk: int, last: int, feeds: dict[int, _Feed]) -> None:
        self.pk = pk
        self.last = last
        self.feeds = feeds
        self.viewers: set[_Viewer] = set()
        self.recent: list[Frame] = []
        self.point_id = "$"  # the last metric point read; set from the stream at start
        self.checked_at = asyncio.get_running_loop().time()  # the record, while points flow
        # A context of its own: the feed outlives the request that started it.
        self.task = asyncio.create_task(self._run(), context=contextvars.Context())

    def attach(self, last: int) -> _Viewer:
        """A new viewer, handed the recent frames after `last` it can use."""
        viewer = _Viewer(self, [f for f in self.recent if f.seq > last])
        self.viewers.add(viewer)
        return viewer

    def detach(self, viewer: _Viewer) -> None:
        self.viewers.discard(viewer)
        if not self.viewers:
            self._close()

    def _close(self) -> None:
        if self.feeds.get(self.pk) is self:
            del self.feeds[self.pk]
        self.task.cancel()

    async def _run(self) -> None:
        client = live.blocking_reader(settings.SSE_KEEPALIVE_S)
        try:
            await self._start_points(client)
            ended = False
            while not ended:
                frames = await self._next(client)
                ended = any(f.end for f in frames)
                self._fan_out(frames)
        except Exception:
            log.exception("live feed of deployment %s failed", self.pk)
        finally:
            self._retire()
            await client.aclose()

    def _retire(self) -> None:
        """After the end (or a failure): streams still attached send their backlog, then
        go on from the record (and a new feed, if the end was not among it)."""
        if self.feeds.get(self.pk) is self:
            del self.feeds[self.pk]
        for viewer in list(self.viewers):
            viewer.drop()

    async def _start_points(self, client: aioredis.Redis) -> None:
        """Points from now on (the page loads earlier ones from the REST API)."""
        try:
            latest: Any = await client.xrevrange(live.points_key(self.pk), count=1)
        except redis.RedisError:
            return
        self.point_id = _text(latest[0][0]) if latest else "0-0"

    async def _next(self, client: aioredis.Redis) -> list[Frame]:
        """The next frames in seq order: from the live stream, else from the record; metric
        points (a stream of their own, read in the same call) go along as they come."""
        try:
            reply: Any = await client.xread(
                {live.stream_key(self.pk): f"0-{self.last}",
                 live.points_key(self.pk): self.point_id},
                block=max(1, settings.SSE_KEEPALIVE_S) * 1000, count=FEED_COUNT)
        except redis.RedisError as exc:
            log.warning("live feed of deployment %s: %s; reading the database", self.pk, exc)
            await asyncio.sleep(REDIS_RETRY_S)
            return await self._record()
        events = [entries for key, entries in reply or [] if _text(key).endswith(":events")]
        points = [entries for key, entries in reply or [] if _text(key).endswith(":points")]
        frames = self._points(points[0]) if points else []
        if not events:
            if frames and not self._record_due():
                return frames
            # Quiet (or only points for a while): anything that missed the live channel.
            return frames + await self._record()
        for entry_id, fields in events[0]:
            seq = live.seq_of(entry_id)
            if seq > self.last + 1:  # the stream was trimmed or an entry lost a race
                frames.extend(await self._record(upto=seq - 1))
            if seq > self.last:
                frames.append(entry_frame(seq, fields))
                self.last = seq
        return frames

    def _record_due(self) -> bool:
        now = asyncio.get_running_loop().time()
        if now - self.checked_at < max(1, settings.SSE_KEEPALIVE_S):
            return False
        self.checked_at = now
        return True

    def _points(self, entries: list[tuple[Any, dict[bytes, bytes]]]) -> list[Frame]:
        self.point_id = _text(entries[-1][0])
        return [point_frame(fields) for _, fields in entries]

    async def _record(self, upto: int | None = None) -> list[Frame]:
        frames: list[Frame] = []
        while True:
            page = await _from_db(self.pk, self.last, upto)
            frames.extend(page)
            if page:
                self.last = page[-1].seq
            if len(page) < REPLAY_PAGE:
                return frames

    def _fan_out(self, frames: list[Frame]) -> None:
        if not frames:
            return
        self.recent = (self.recent + [f for f in frames if f.seq != POINT])[-RECENT_FRAMES:]
        for viewer in list(self.viewers):
            viewer.push(frames)
