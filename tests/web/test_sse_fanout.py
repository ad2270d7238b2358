"""The SSE live feed in-process: one reader per deployment, and a viewer that falls behind."""

from __future__ import annotations

import asyncio
import re

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from web.deployments import services, sse

from .specs import spec

pytestmark = pytest.mark.django_db(transaction=True)


def _seqs(chunks: list[bytes]) -> list[int]:
    return [int(n) for n in re.findall(rb"^id: (\d+)$", b"".join(chunks), re.MULTILINE)]


async def _read_until(stream: object, seq: int, limit_s: float = 10) -> list[bytes]:
    chunks: list[bytes] = []
    async with asyncio.timeout(limit_s):
        while not _seqs(chunks) or _seqs(chunks)[-1] < seq:
            chunks.append(await anext(stream))  # type: ignore[call-overload]
    return chunks


def _append(pk: int, n: int) -> int:
    try:
        rows = services.events_append(deployment_id=pk, events=[("log", {"text": "l"})] * n)
    finally:
        connection.close()  # a worker thread's: back to the pool
    return rows[-1].seq


def test_a_viewer_that_falls_behind_catches_up_from_the_database(live_channel, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sse, "BACKLOG_FRAMES", 5)
    dropped = []
    drop = sse._Viewer.drop

    def counting_drop(viewer: sse._Viewer) -> None:
        dropped.append(viewer)
        drop(viewer)

    monkeypatch.setattr(sse._Viewer, "drop", counting_drop)
    pk = services.deployment_create(data=spec(), confirm_warnings=True).pk

    async def scenario() -> tuple[list[int], list[int], int]:
        slow, fast = sse._events(pk, 0), sse._events(pk, 0)
        slow_chunks = await _read_until(slow, 2)  # the record so far (queued, preflight)
        waiting = asyncio.ensure_future(anext(slow))  # attached to the feed, then not read
        last = 2 + 6 * 4
        fast_reader = asyncio.ensure_future(_read_until(fast, last))
        for _ in range(6):
            await asyncio.sleep(0.2)  # the feed fans each batch out on its own
            await sync_to_async(_append, thread_sensitive=False)(pk, 4)
        fast_chunks = await fast_reader
        feeds = sse._feeds[asyncio.get_running_loop()]
        assert list(feeds) == [pk] and len(feeds[pk].viewers) == 1  # one reader; fast only
        slow_chunks += [await waiting, *await _read_until(slow, last)]
        await slow.aclose()
        await fast.aclose()
        assert not feeds  # the last viewer gone, the reader stops
        return _seqs(slow_chunks), _seqs(fast_chunks), last

    slow, fast, last = asyncio.run(scenario())
    assert dropped
    assert slow == list(range(1, last + 1))
    assert fast == list(range(1, last + 1))
