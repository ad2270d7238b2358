"""The live feed of one deployment's events, shared by all its event streams in a process
(web/deployments/sse.py serves them).

It is one Redis reader per deployment and process (an asyncio task). It frames each event
once and keeps what it read in a ring of batches (RING_FRAMES, RING_BYTES); a stream is
only a place in that ring, and a stream that is caught up sends each batch as the very
bytes object every other stream sends. So a slow client holds no backlog of its own: while
the server waits on its socket it holds at most one send (SEND_BYTES, or one frame longer
than that). Its socket is bounded too (sse.py, with_stream_sockets). A feed that many
streams follow pauses a little after each fan-out (fanout_pause), so a busy engine's
batches reach each of them joined, in fewer sends; the feed also wakes its streams for
their keep-alives, so a waiting stream holds no timer.

A stream behind the ring (it joined behind, or fell behind) catches up from the record in
pages that the feed reads once for all such streams, one read at a time (the feed keeps
the pages of the last SKIP_LAG events, so each is read once however many streams are
behind); a stream more than SKIP_LAG behind the head (a background tab, or a resumption
from long ago) is sent a `skip` frame naming the seqs it will not get and goes on
SKIP_TAIL events before the head. A stream behind the ring but within SKIP_LAG is first
sent a `behind` frame (the page says it is catching up), then every event from the
record, however slowly its client reads: a client starved of CPU loses nothing.
No path replays a long record: the page opens at the tail and pages back through the
history view.

Metric points ride along (frames.py): the feed reads the deployment's points stream in
the same XREAD and passes them on without an id; they are never replayed.

No stream holds a database connection while it waits: each read is one short call on a
worker thread that hands its connection back (to the pool) before returning.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import logging
import weakref
from collections import OrderedDict
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from . import live
from .frames import (
    POINT,
    Frame,
    behind_frame,
    entry_frame,
    point_frame,
    skip_frame,
)
from .frames import text as _text
from .streams import (
    REPLAY_PAGE,
    Batch,
    Page,
    Stream,
    Viewer,
    cut_frames,
    fanout_pause,
    from_db,
    record_head,
)

log = logging.getLogger(__name__)

FEED_COUNT = 2000  # entries per XREAD: a feed behind the live stream catches up in few reads
RING_FRAMES = 10_000  # what a feed keeps for its streams (5 s of a busy engine's 2,000/s)...
RING_BYTES = 8 * 2**20  # ... and at most this much of it
SKIP_LAG = 20_000  # a stream further behind the head than this skips ahead...
SKIP_TAIL = 500  # ... to this many events before the head (the page's tail is as long)
# The catch-up pages a feed keeps: all those of the last SKIP_LAG events, so that streams
# behind the ring at many places read each page once between them (16 pages made 1,000
# viewers reading on from where each stalled read the same pages again and again).
CATCHUP_PAGES = SKIP_LAG // REPLAY_PAGE + 2
SEND_BYTES = 2**16  # what a stream hands the server at once, at most (or one frame)
BATCH_BYTES = 2**16  # a batch of the ring, at most (or one frame): a read is cut into such
REDIS_RETRY_S = 1.0  # while Redis fails, a feed polls the database this often

# The feeds of the running event loop (uvicorn runs one per process), by deployment.
loop_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Feed]] = (
    weakref.WeakKeyDictionary())


def feed_for(pk: int) -> Feed:
    feeds = loop_feeds.setdefault(asyncio.get_running_loop(), {})
    feed = feeds.get(pk)
    if feed is None:
        feed = feeds[pk] = Feed(pk, feeds)
    return feed


class Feed:
    """Reads one deployment's Redis stream for every stream of it in this process, and
    keeps what it read in a ring that all of them send from.

    A stream behind the ring catches up from the record in pages that the feed reads once
    for all of them (one read at a time); a stream more than SKIP_LAG behind the head is
    told which seqs it skipped and goes on near the head."""

    def __init__(self, pk: int, feeds: dict[int, Feed]) -> None:
        self.pk = pk
        self.feeds = feeds
        self.viewers: set[Viewer] = set()
        self.ring: list[Batch] = []
        self.first_batch = 0  # the number of ring[0]; batches are numbered as they come
        self.ring_frames = self.ring_bytes = 0
        self.floor = 0  # the ring holds the events after this seq
        self.head = 0  # ... up to this one
        self.batch_after = 0  # where the batch being read begins
        self.pages: OrderedDict[int, asyncio.Task[Page]] = OrderedDict()
        self.reading = asyncio.Lock()  # one catch-up read at a time
        self.closed = False
        self.point_id = "$"  # the last metric point read; set from the stream at start
        self.checked_at = asyncio.get_running_loop().time()  # the record, while points flow
        self.sent_at = self.checked_at  # the last fan-out or keep-alive
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A context of its own: the feed outlives the request that started it.
        self.task = asyncio.create_task(self._run(), context=contextvars.Context())

    # ------------------------------------------------------------ streams' side

    def attach(self) -> Viewer:
        viewer = Viewer()
        self.viewers.add(viewer)
        return viewer

    def detach(self, viewer: Viewer) -> None:
        self.viewers.discard(viewer)
        if not self.viewers:
            self._close()

    async def chunk_for(self, stream: Stream, viewer: Viewer) -> bytes:
        """The next bytes for a stream (b"" when it has all there is): a skip frame, a
        catch-up from the record, or the ring's batches after its place."""
        if self.head - stream.last > SKIP_LAG:
            viewer.behind = False
            return self._skip(stream, self.head - SKIP_TAIL)
        if stream.last < self.floor:
            # Behind the ring, however slowly its client reads (a starved client, a tab
            # that stopped reading): every event from the record, in order, and a stream
            # that was live told once that it fell behind; only SKIP_LAG behind skips.
            told = b""
            if viewer.live and not viewer.behind:
                viewer.behind = True
                told = behind_frame(stream.last, self.head).data
            return told + await self._catch_up(stream)
        viewer.behind = False
        viewer.live = True
        return self._from_ring(stream, viewer)

    def _skip(self, stream: Stream, target: int) -> bytes:
        frame = skip_frame(stream.last + 1, target)
        log.info("event stream of deployment %s skipped seqs %d-%d (too far behind)",
                 self.pk, stream.last + 1, target)
        stream.last = target
        return frame.data

    async def _catch_up(self, stream: Stream) -> bytes:
        """Pages of the record up to the ring, a send's worth."""
        parts: list[bytes] = []
        size = 0
        while stream.last < self.floor and size < SEND_BYTES and not stream.ended:
            page = await self.page(stream.last // REPLAY_PAGE, after=stream.last)
            # On into the page's end, not to the floor only: the page holds every event up
            # to its upto, and the ring's floor may lie inside it (the stream then joins
            # the ring mid-batch); taking it to the floor sent the events between the
            # floor and the page's end twice. A send's worth: the rest comes next time.
            taken = stream.take(page.frames, upto=page.upto, limit=SEND_BYTES - size)
            parts.extend(taken)
            size += sum(len(p) for p in taken)
        return b"".join(parts)

    async def page(self, k: int, *, after: int) -> Page:
        """Page k of the record, read once for every stream that needs it; again only when
        the copy held ends at or before `after` (it was read while the head was there)."""
        while True:
            task = self.pages.get(k)
            if task is None or (task.done() and (task.cancelled() or task.exception()
                                                 or task.result().upto <= after)):
                task = self.pages[k] = asyncio.create_task(self._read_page(k))
                while len(self.pages) > CATCHUP_PAGES:
                    self.pages.popitem(last=False)
            self.pages.move_to_end(k)
            page = await asyncio.shield(task)
            if page.upto > after:
                return page

    async def _read_page(self, k: int) -> Page:
        async with self.reading:
            upto = min((k + 1) * REPLAY_PAGE, self.head)
            frames = await from_db(self.pk, k * REPLAY_PAGE, upto)
        return Page(upto, tuple(frames))

    def _from_ring(self, stream: Stream, viewer: Viewer) -> bytes:
        """The ring's batches after the viewer's place, a send's worth; a batch the stream
        wants whole goes out as the very bytes object every other stream sends."""
        parts: list[bytes] = []
        size = 0
        i = viewer.next_batch - self.first_batch
        if viewer.at != stream.last or not 0 <= i <= len(self.ring):
            i = bisect.bisect_right(self.ring, stream.last, key=lambda b: b.last)
        while i < len(self.ring) and not stream.ended:
            batch = self.ring[i]
            if parts and size + len(batch.data) > SEND_BYTES:
                break
            i += 1
            if batch.after == stream.last and not batch.end:
                parts.append(batch.data)
                stream.last = batch.last
            else:  # joined mid-batch, or the end is in it: frame by frame
                parts.append(b"".join(stream.take(batch.frames, upto=batch.last)))
            size += len(parts[-1])
        viewer.next_batch, viewer.at = self.first_batch + i, stream.last
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _close(self) -> None:
        if self.feeds.get(self.pk) is self:
            del self.feeds[self.pk]
        self.closed = True
        self.task.cancel()
        for task in self.pages.values():
            task.cancel()

    # ------------------------------------------------------------- the reader

    async def _run(self) -> None:
        client = live.blocking_reader(settings.SSE_KEEPALIVE_S)
        # XREAD's reply as hiredis parsed it ({key: [[id, [name, value, ...]], ...]}):
        # redis-py's own callback builds a dict per entry, 1.5-1.6 us of the panel's CPU an
        # entry against 0.9-1.1 without it (2,000-entry reads; docs/performance.md, Log path).
        client.set_response_callback("XREAD", _as_parsed)
        try:
            # The ring starts at the record's head: a stream behind it catches up from
            # the record (or skips), never the feed itself.
            self.head = self.floor = await record_head(self.pk)
            self.ready.set_result(None)
            await self._start_points(client)
            # Closed is checked, not only the task's cancellation: redis-py can swallow a
            # cancel that lands as its read's own timeout fires, and retry the read.
            while not self.closed:
                self.batch_after = self.head
                frames = await self._next(client)
                if frames:
                    self._fan_out(frames)
                    await self._pace()
                else:
                    self._keep_alive()
        except Exception as exc:
            log.exception("live feed of deployment %s failed", self.pk)
            if not self.ready.done():
                self.ready.set_exception(exc)
        finally:
            self._retire()
            await client.aclose()

    def _retire(self) -> None:
        """After a failure: streams still attached leave it, and go on with a new feed."""
        if self.feeds.get(self.pk) is self:
            del self.feeds[self.pk]
        self.closed = True
        for viewer in list(self.viewers):
            viewer.wake()

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
                {live.stream_key(self.pk): f"0-{self.head}",
                 live.points_key(self.pk): self.point_id},
                block=max(1, settings.SSE_KEEPALIVE_S) * 1000, count=FEED_COUNT)
        except redis.RedisError as exc:
            log.warning("live feed of deployment %s: %s; reading the database", self.pk, exc)
            await asyncio.sleep(REDIS_RETRY_S)
            return await self._record()
        streams = reply.items() if isinstance(reply, dict) else reply or []  # RESP3, RESP2
        events = [entries for key, entries in streams if _text(key).endswith(":events")]
        points = [entries for key, entries in streams if _text(key).endswith(":points")]
        frames = self._points(points[0]) if points else []
        if not events:
            if frames and not self._record_due():
                return frames
            # Quiet (or only points for a while): anything that missed the live channel.
            return frames + await self._record()
        for entry_id, fields in events[0]:
            seq = live.seq_of(entry_id)
            if seq > self.head + 1:  # the stream was trimmed or an entry lost a race
                start = self.batch_after
                filled = await self._record(upto=seq - 1)
                if self.batch_after != start:  # the ring started again after this batch's
                    frames = [f for f in frames if f.seq == POINT]  # events: they are behind it
                frames.extend(filled)
            if seq > self.head:
                frames.append(entry_frame(seq, fields))
                self.head = seq
        return frames

    def _record_due(self) -> bool:
        now = asyncio.get_running_loop().time()
        if now - self.checked_at < max(1, settings.SSE_KEEPALIVE_S):
            return False
        self.checked_at = now
        return True

    def _points(self, entries: list[list[Any]]) -> list[Frame]:
        self.point_id = _text(entries[-1][0])
        return [point_frame(fields) for _, fields in entries]

    async def _record(self, upto: int | None = None) -> list[Frame]:
        """The record after the head (up to `upto`, else its own head): the events the
        live channel missed. Of a gap longer than the ring, only its last RING_FRAMES:
        the ring starts again there, and streams before it catch up or skip."""
        if upto is None:
            upto = await record_head(self.pk)
        if upto - self.head > RING_FRAMES:
            self._restart_ring(upto - RING_FRAMES)
        frames: list[Frame] = []
        while self.head < upto:
            page = await from_db(self.pk, self.head, upto)
            frames.extend(page)
            # Past seqs the record no longer has (retention), or a page short of upto.
            self.head = page[-1].seq if len(page) == REPLAY_PAGE else upto
        return frames

    def _restart_ring(self, at: int) -> None:
        self.first_batch += len(self.ring)
        self.ring.clear()
        self.ring_frames = self.ring_bytes = 0
        self.floor = self.head = self.batch_after = at

    async def _pace(self) -> None:
        pause = fanout_pause(len(self.viewers))
        if pause:
            await asyncio.sleep(pause)

    def _keep_alive(self) -> None:
        """After SSE_KEEPALIVE_S with nothing for the streams, wake them to send one."""
        now = asyncio.get_running_loop().time()
        if now - self.sent_at >= max(1, settings.SSE_KEEPALIVE_S):
            self.sent_at = now
            for viewer in self.viewers:
                viewer.wake(keepalive=True)

    def _fan_out(self, frames: list[Frame]) -> None:
        self.sent_at = asyncio.get_running_loop().time()
        after = self.batch_after
        parts = list(cut_frames(frames, BATCH_BYTES))
        for n, part in enumerate(parts, 1):
            data = b"".join(f.data for f in part)
            # The last part ends at the head (past seqs the record no longer has); a
            # point's seq is below any event's.
            last = self.head if n == len(parts) else max(after, *(f.seq for f in part))
            self.ring.append(Batch(after, last, tuple(part), data, any(f.end for f in part)))
            after = last
            self.ring_frames += len(part)
            self.ring_bytes += len(data)
        self._trim()
        for viewer in self.viewers:
            viewer.wake()

    def _trim(self) -> None:
        drop = 0
        while len(self.ring) - drop > 1 and (self.ring_frames > RING_FRAMES
                                             or self.ring_bytes > RING_BYTES):
            batch = self.ring[drop]
            self.ring_frames -= len(batch.frames)
            self.ring_bytes -= len(batch.data)
            self.floor = batch.last
            drop += 1
        if drop:
            del self.ring[:drop]
            self.first_batch += drop


def _as_parsed(response: Any, **options: Any) -> Any:
    return response
