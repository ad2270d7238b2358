"""The SSE live feed in-process (real PostgreSQL and Redis): one reader and one ring per
deployment, streams that fall behind, and the ones too far behind to catch up."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.signals import connection_created

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import feed as live_feed
from web.deployments import services, sse, streams

pytestmark = pytest.mark.django_db(transaction=True)


def _seqs(chunks: list[bytes]) -> list[int]:
    """The seqs of the events in chunks (a skip or behind frame is no event of its own)."""
    return [body["seq"] for body in _bodies(chunks)
            if body.get("kind") not in ("skip", "behind")]


def _bodies(chunks: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(rb"^data: (.*)$", b"".join(chunks), re.M)]


async def _read_until(stream: AsyncIterator[bytes], seq: int, limit_s: float = 60) -> list[bytes]:
    chunks: list[bytes] = []
    last = 0
    async with asyncio.timeout(limit_s):
        while last < seq:
            chunks.append(await anext(stream))
            ids = re.findall(rb"^id: (\d+)$", chunks[-1], re.M)
            last = int(ids[-1]) if ids else last
    return chunks


def _append(pk: int, n: int) -> int:
    try:
        rows = services.events_append(deployment_id=pk, events=[("log", {"text": "l"})] * n)
    finally:
        connection.close()  # a worker thread's: back to the pool
    return rows[-1].seq


async def _append_async(pk: int, n: int) -> int:
    return await sync_to_async(_append, thread_sensitive=False)(pk, n)


def _feed(pk: int) -> live_feed.Feed:
    return live_feed.loop_feeds[asyncio.get_running_loop()][pk]


@pytest.fixture
def event_reads() -> Iterator[list[str]]:
    """The SQL reads of the event table on every thread's connection, as they run."""
    reads: list[str] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool,
               context: Any) -> Any:
        if "deployments_event" in sql and sql.lstrip().upper().startswith("SELECT"):
            reads.append(sql)
        return execute(sql, params, many, context)

    def install(sender: Any, connection: Any, **kwargs: Any) -> None:
        if record not in connection.execute_wrappers:
            connection.execute_wrappers.append(record)

    connection_created.connect(install)
    yield reads
    connection_created.disconnect(install)


def test_streams_behind_the_ring_share_one_catch_up_read_per_page(live_channel, event_reads):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    last = _append(pk, 1200)  # in the record before any feed: behind its ring
    pages = -(-last // streams.REPLAY_PAGE)

    async def scenario() -> list[list[int]]:
        streams = [sse._events(pk, 0) for _ in range(20)]
        event_reads.clear()
        read = await asyncio.gather(*(_read_until(s, last) for s in streams))
        for stream in streams:
            await stream.aclose()
        return [_seqs(chunks) for chunks in read]

    seqs = asyncio.run(scenario())
    assert all(s == list(range(1, last + 1)) for s in seqs)
    assert len(event_reads) == pages  # 20 streams, one read of each page between them


def test_a_caught_up_batch_is_the_same_bytes_for_every_stream(live_channel):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    first = _append(pk, 1)

    async def scenario() -> tuple[bytes, bytes]:
        a, b = sse._events(pk, first), sse._events(pk, first)
        assert await anext(a) == await anext(b) == b"retry: 2000\n\n"
        waiting = [asyncio.ensure_future(anext(a)), asyncio.ensure_future(anext(b))]
        await asyncio.sleep(0.5)  # both attached and waiting on the feed
        await _append_async(pk, 5)
        async with asyncio.timeout(30):
            got_a, got_b = await asyncio.gather(*waiting)
        await a.aclose()
        await b.aclose()
        return got_a, got_b

    got_a, got_b = asyncio.run(scenario())
    assert _seqs([got_a])[0] == first + 1  # what the feed's read brought (maybe not all 5)
    assert got_a is got_b  # framed and joined once, by the feed


def test_a_stream_that_stops_reading_is_told_where_it_skipped_to_and_costs_the_others_nothing(live_channel):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    start = _append(pk, 1)

    async def scenario() -> tuple[list[bytes], list[bytes], int, live_feed.Feed]:
        fast, stalled = sse._events(pk, start), sse._events(pk, start)
        await anext(fast)
        await anext(stalled)
        pending = asyncio.ensure_future(anext(stalled))  # attached, then never read on
        await asyncio.sleep(0.5)
        fast_chunks: list[bytes] = []
        last = start
        for _ in range(live_feed.SKIP_LAG // 2000 + 2):  # past SKIP_LAG, as a busy engine's
            last = await _append_async(pk, 2000)
            fast_chunks += await _read_until(fast, last)
        feed = _feed(pk)
        ring = (feed.ring_frames, feed.ring_bytes, len(feed.viewers))
        stalled_chunks = [await pending, *await _read_until(stalled, last)]
        await fast.aclose()
        await stalled.aclose()
        assert ring[0] <= live_feed.RING_FRAMES and ring[1] <= live_feed.RING_BYTES and ring[2] == 2
        return fast_chunks, stalled_chunks, last, feed

    fast, stalled, last, feed = asyncio.run(scenario())
    assert _seqs(fast) == list(range(start + 1, last + 1))  # every event, once, in order
    skips = [b for b in _bodies(stalled) if b["kind"] == "skip"]
    assert len(skips) == 1
    skip = skips[0]["payload"]
    seqs = _seqs(stalled)
    # What it got before the skip, the skip's range, then the rest: each seq once.
    before = [s for s in seqs if s < skip["from"]]
    after = [s for s in seqs if s > skip["to"]]
    assert before + after == seqs
    assert before == list(range(start + 1, skip["from"]))
    assert after == list(range(skip["to"] + 1, last + 1))
    assert skip["skipped"] == skip["to"] - skip["from"] + 1 > 0
    assert skips[0]["seq"] == skip["to"]  # its id: a reconnect resumes after the skipped seqs
    assert feed.closed  # the last stream gone, the reader stops


def test_a_stream_that_fell_behind_the_ring_is_told_so_and_gets_every_event_from_the_record(live_channel):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    start = _append(pk, 1)

    async def scenario() -> tuple[list[bytes], list[bytes], int]:
        fast, slow = sse._events(pk, start), sse._events(pk, start)
        await anext(fast)
        await anext(slow)
        pending = asyncio.ensure_future(anext(slow))  # attached; its client then starved
        await asyncio.sleep(0.5)
        fast_chunks: list[bytes] = []
        last = start
        # Past the ring (RING_FRAMES), within SKIP_LAG: as a client too slow for a while.
        for _ in range(live_feed.RING_FRAMES // 2000 + 2):
            last = await _append_async(pk, 2000)
            fast_chunks += await _read_until(fast, last)
        assert _feed(pk).floor > start + 1 and last - start < live_feed.SKIP_LAG
        slow_chunks = [await pending, *await _read_until(slow, last)]
        for stream in (fast, slow):
            await stream.aclose()
        return fast_chunks, slow_chunks, last

    fast, slow, last = asyncio.run(scenario())
    assert _seqs(fast) == list(range(start + 1, last + 1))
    bodies = _bodies(slow)
    assert not [b for b in bodies if b["kind"] == "skip"]  # nothing skipped
    behind = [b for b in bodies if b["kind"] == "behind"]
    assert len(behind) == 1  # told once, where it fell behind
    told = behind[0]
    assert told["payload"]["from"] == told["seq"] + 1
    assert told["payload"]["behind"] == told["payload"]["head"] - told["seq"] > 0
    assert _seqs(slow) == list(range(start + 1, last + 1))  # every event, once, in order
    # The behind frame has no id: a reconnect resumes after the last event it got.
    assert b"id: %d\ndata: {\"seq\":%d,\"kind\":\"behind\"" % (told["seq"], told["seq"]) \
        not in b"".join(slow)


def test_a_new_stream_from_the_start_of_a_long_record_gets_the_tail_not_the_whole(live_channel):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    last = _append(pk, live_feed.SKIP_LAG + 5000)

    async def scenario() -> list[bytes]:
        stream = sse._events(pk, 0)  # no Last-Event-ID
        chunks = await _read_until(stream, last)
        await stream.aclose()
        return chunks

    chunks = asyncio.run(scenario())
    bodies = _bodies(chunks)
    assert bodies[0]["kind"] == "skip"
    assert bodies[0]["payload"] == {"from": 1, "to": last - live_feed.SKIP_TAIL,
                                    "skipped": last - live_feed.SKIP_TAIL}
    assert _seqs(chunks) == list(range(last - live_feed.SKIP_TAIL + 1, last + 1))
    assert sum(len(c) for c in chunks) < 200_000  # the tail's bytes, not the record's


def test_a_resumption_by_last_event_id_gets_exactly_the_seqs_after_it(live_channel):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    before = _append(pk, 700)

    async def scenario() -> tuple[list[int], list[int], int]:
        first = sse._events(pk, 0)
        await _read_until(first, before)  # the feed and its ring are up
        last = await _append_async(pk, 300)
        resumed = sse._events(pk, 650)  # behind the ring: from the record, then the ring
        inside = sse._events(pk, before + 100)  # inside the ring
        got = await _read_until(resumed, last), await _read_until(inside, last)
        for stream in (first, resumed, inside):
            await stream.aclose()
        return _seqs(got[0]), _seqs(got[1]), last

    resumed, inside, last = asyncio.run(scenario())
    assert resumed == list(range(651, last + 1))
    assert inside == list(range(before + 101, last + 1))


def test_a_feed_pauses_after_a_fan_out_only_when_many_streams_follow_it() -> None:
    assert streams.fanout_pause(1) == streams.fanout_pause(9) == 0  # an operator's tab: no delay
    assert 0 < streams.fanout_pause(20) < streams.fanout_pause(60) < streams.FANOUT_MAX_S
    assert streams.fanout_pause(100) == streams.fanout_pause(5000) == streams.FANOUT_MAX_S


def test_many_streams_of_a_pausing_feed_get_every_event_once_in_order(live_channel):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    start = _append(pk, 1)
    streams_n, appends, size = 120, 30, 7
    last = start + appends * size  # a deployment's seqs have no gaps
    assert streams.fanout_pause(streams_n) == streams.FANOUT_MAX_S  # the feed pauses between reads

    async def scenario() -> list[list[int]]:
        streams = [sse._events(pk, start) for _ in range(streams_n)]
        for stream in streams:
            assert await anext(stream) == b"retry: 2000\n\n"
        reading = [asyncio.ensure_future(_read_until(s, last)) for s in streams]
        await asyncio.sleep(0.5)  # all attached to the feed
        for _ in range(appends):  # one publish each, faster than the feed's pause
            await _append_async(pk, size)
        got = await asyncio.gather(*reading)
        for stream in streams:
            await stream.aclose()
        return [_seqs(chunks) for chunks in got]

    seqs = asyncio.run(scenario())
    assert len(seqs) == streams_n
    assert all(s == list(range(start + 1, last + 1)) for s in seqs)


def test_a_stream_behind_the_ring_whose_floor_lies_inside_a_page_gets_each_seq_once(live_channel):  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    floor = _append(pk, 700)  # where the feed's ring starts: inside the page 501-1000

    async def scenario() -> tuple[list[int], int]:
        first = sse._events(pk, floor)
        await anext(first)
        waiting = asyncio.ensure_future(_read_until(first, floor + 300))
        await asyncio.sleep(0.5)  # the feed is up, its ring from the floor
        last = await _append_async(pk, 300)
        await waiting  # the feed's head is past the page's end
        assert _feed(pk).floor == floor
        behind = sse._events(pk, 650)  # its page is read whole: 501-1000
        got = await _read_until(behind, last)
        for stream in (first, behind):
            await stream.aclose()
        return _seqs(got), last

    seqs, last = asyncio.run(scenario())
    assert seqs == list(range(651, last + 1))
