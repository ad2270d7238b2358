"""One event stream's place and what it is sent from (web/deployments/sse.py serves the
streams, feed.py reads for them): Stream (the seqs it sent), Viewer (its place in its
feed's ring), the ring's Batch and a catch-up Page, the record's reads (from_db,
record_head, each on a worker thread that hands its connection back before it returns),
and how long a feed pauses after a fan-out (fanout_pause)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import NamedTuple

from asgiref.sync import sync_to_async
from django.db import connection

from . import logpane, selectors
from .frames import Frame, event_frame

REPLAY_PAGE = 500  # events per read of the record (a catch-up page)
# After a fan-out a feed pauses this long per stream (fanout_pause), at most FANOUT_MAX_S
# (100 streams and more on one process: a send each 50 ms), and not at all below
# FANOUT_MIN_S (fewer than 10 streams).
FANOUT_S_PER_STREAM = 0.000_5
FANOUT_MIN_S = 0.005
FANOUT_MAX_S = 0.05
MAX_SEQ = 2**63 - 1  # an event seq is a PostgreSQL bigint; Redis ids stop there too


def _db_frames(pk: int, after: int, upto: int) -> list[Frame]:
    """The record's events in (after, upto], at most a page of them, framed; on a worker
    thread, its connection back in the pool before it returns."""
    try:
        events = selectors.events_after(deployment_id=pk, after_seq=after, limit=REPLAY_PAGE)
    finally:
        connection.close()
    return [event_frame(e.to_wire()) for e in events if e.seq <= upto]


async def from_db(pk: int, after: int, upto: int) -> list[Frame]:
    # Off the request's thread: the default executor's few threads also cap how many
    # feeds read the database at once.
    return await sync_to_async(_db_frames, thread_sensitive=False)(pk, after, upto)


def _db_head(pk: int) -> int:
    try:
        return logpane.event_last_seq(deployment_id=pk)
    finally:
        connection.close()


async def record_head(pk: int) -> int:
    """The deployment's last seq in the record: everything up to it is committed."""
    return await sync_to_async(_db_head, thread_sensitive=False)(pk)


# ---------------------------------------------------------------- one stream


class Stream:
    """One client's position: it sends each seq once, in order, up to the end."""

    def __init__(self, pk: int, last: int) -> None:
        self.pk = pk
        self.last = last
        self.ended = False

    def take(self, frames: Iterable[Frame], upto: int,
             limit: int = MAX_SEQ) -> list[bytes]:
        """The frames after `last`, up to the end; then `last` is upto (the caller knows
        nothing else lies in between: seqs the retention removed). Once `limit` bytes
        are taken the rest is left for the next call: `last` is then the last frame's."""
        out: list[bytes] = []
        size = 0
        for frame in frames:
            if frame.seq <= self.last:
                continue
            if size >= limit:
                return out
            out.append(frame.data)
            size += len(frame.data)
            self.last = frame.seq
            if frame.end:
                self.ended = True
                return out
        self.last = max(self.last, upto)
        return out


# ------------------------------------------------------------- the live feed


def fanout_pause(streams: int) -> float:
    """How long a feed waits after a fan-out before it reads on, for this many streams.

    Each fan-out costs one send per stream, and a busy engine's batches come 50 times a
    second and more: with many streams the feed joins what comes meanwhile into one
    batch, so each stream gets fewer, larger sends (measured: the panel's
    CPU per delivered event went down 2.4x under 200 viewers, see docs/performance.md).
    A feed with few streams (an operator's tab, a log being watched) reads on at once,
    and a quiet one is not slowed at all: its next event finds the read waiting."""
    pause = min(FANOUT_MAX_S, FANOUT_S_PER_STREAM * streams)
    return pause if pause >= FANOUT_MIN_S else 0.0


class Viewer:
    """A stream's place in its feed's ring (the next batch to look at) and a way to wake
    it; nothing else per stream: the frames live once, in the feed.

    A waiting stream has no timer of its own: the feed, which reads the deployment for all
    of its streams, wakes them for a keep-alive when it was quiet (a timer per wait was a
    tenth of the panel's samples under 200 viewers)."""

    def __init__(self) -> None:
        self.next_batch = 0
        self.at = -1  # the stream's seq when next_batch was set: else it is looked up
        self.waiter: asyncio.Future[bool] | None = None
        self.live = False  # it has sent from the ring (a replay at its start is not)
        self.behind = False  # it fell behind the ring, and was told so

    def wake(self, *, keepalive: bool = False) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(keepalive)

    async def wait(self) -> bool:
        """Until the feed has more (False) or says it was quiet (True: a keep-alive)."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            return await self.waiter
        finally:
            self.waiter = None


class Batch(NamedTuple):
    """What one read of the live channel brought, framed and joined once for every stream:
    the events after seq `after` up to `last` (contiguous with the batch before)."""

    after: int
    last: int
    frames: tuple[Frame, ...]
    data: bytes
    end: bool


class Page(NamedTuple):
    """A catch-up read: the record's events in (k * REPLAY_PAGE, upto], framed once."""

    upto: int
    frames: tuple[Frame, ...]


def cut_frames(frames: list[Frame], size: int) -> Iterable[list[Frame]]:
    """Frames in runs of at most `size` bytes (or one frame): a feed behind Redis reads
    2,000 entries at once and fills a gap with up to RING_FRAMES, and a stream hands
    the server a batch whole."""
    part: list[Frame] = []
    held = 0
    for frame in frames:
        if part and held + len(frame.data) > size:
            yield part
            part, held = [], 0
        part.append(frame)
        held += len(frame.data)
    if part:
        yield part
