"""The live channel: one Redis stream per deployment.

The database is the record; the stream only carries new events to open SSE
connections. Entry ids are `0-<seq>`, so a reader resumes from a sequence
number directly, and a gap (a trimmed stream, or an entry that lost a race)
is filled from the database.

An entry's `data` is the event's JSON exactly as an SSE frame carries it and `kind`
is the event's kind, so a reader frames an entry without decoding it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from appliance import jsontext

log = logging.getLogger(__name__)

# What a deployment's live stream keeps (Redis trims to about this many entries): 2 s of the
# busiest engine the log path is built for (10,000 decode lines/s: 20,000 events/s), about 12 MB.
# A panel's feed that falls further behind fills the gap from PostgreSQL, through the ORM,
# which costs the panel and the database more than the stream did; at 5,000 (0.25 s of that
# rate) one hiccup made every feed read the database, the feed fell further behind, and the
# one viewer of bench/log_path.py's sustained phase was skipped past 200,000-550,000 events
# (py-spy on the panel: `_db_frames` 30.6 % of its samples; docs/performance.md, Log path).
STREAM_MAXLEN = 40_000
POINTS_MAXLEN = 100  # a late stream gets later points only; the REST API has the rest


def stream_key(deployment_id: int) -> str:
    return f"appliance:deployment:{deployment_id}:events"


def points_key(deployment_id: int) -> str:
    """Metric points: live only (the series table is their record), never events."""
    return f"appliance:deployment:{deployment_id}:points"


@cache
def _client(url: str) -> redis.Redis:
    """One client (and connection pool) per process: a publish costs no new connection."""
    return redis.Redis.from_url(url, socket_timeout=settings.REDIS_SOCKET_TIMEOUT_S)


def wire_json(event: dict[str, Any]) -> str:
    return jsontext.dumps_text(event)


def publish(deployment_id: int, wire_events: Iterable[dict[str, Any]]) -> None:
    """Best effort: a failed publish loses nothing, readers fill gaps from the database."""
    publish_entries(deployment_id, [(e["seq"], e["kind"], wire_json(e)) for e in wire_events])


# One script call adds a whole batch, entry by entry as XADD would (same ids, same fields,
# so readers see no difference): redis-py packing one XADD command per event was most
# of the live publisher's time (profiled). The ids, kinds and data come as three joined
# arguments (data is JSON, which has no raw newline), so the client packs three strings
# per batch, not three per event. An entry whose id is not above the stream's last (it
# lost a race) is skipped, as a failed XADD in a pipeline was.
_ADD_ENTRIES = """
local ids, kinds, datas = ARGV[2], ARGV[3], ARGV[4]
local i, k, d = 1, 1, 1
while i <= #ids do
  local ie = string.find(ids, ' ', i, true) or (#ids + 1)
  local ke = string.find(kinds, ' ', k, true) or (#kinds + 1)
  local de = string.find(datas, '\\n', d, true) or (#datas + 1)
  redis.pcall('XADD', KEYS[1], string.sub(ids, i, ie - 1), 'data', string.sub(datas, d, de - 1),
              'kind', string.sub(kinds, k, ke - 1))
  i, k, d = ie + 1, ke + 1, de + 1
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', ARGV[1])
return 0
"""
_ENTRIES_PER_CALL = 5000  # keeps one call's size and Redis's pause for it small

Entry = tuple[int, str, str]  # seq, kind, data (the event's JSON as an SSE frame carries it)
Entries = list[Entry] | Callable[[], list[Entry]]


@cache
def _add_entries(url: str) -> Any:
    return _client(url).register_script(_ADD_ENTRIES)


def publish_entries(deployment_id: int, entries: list[Entry]) -> None:
    """Add prepared entries to the deployment's stream, in order; best effort."""
    try:
        script = _add_entries(settings.REDIS_URL)
        for start in range(0, len(entries), _ENTRIES_PER_CALL):
            chunk = entries[start:start + _ENTRIES_PER_CALL]
            ids = " ".join([f"0-{seq}" for seq, _, _ in chunk])
            kinds = " ".join([kind for _, kind, _ in chunk])
            datas = "\n".join([data for _, _, data in chunk])
            script(keys=[stream_key(deployment_id)], args=[STREAM_MAXLEN, ids, kinds, datas])
    except redis.RedisError as exc:
        log.warning("live publish for deployment %s failed: %s", deployment_id, exc)


def publish_point(deployment_id: int, point: dict[str, Any]) -> None:
    """A metric point for open SSE streams (an event without a seq); best effort."""
    try:
        _client(settings.REDIS_URL).xadd(
            points_key(deployment_id), {"data": wire_json({"kind": "point", "payload": point})},
            maxlen=POINTS_MAXLEN, approximate=True)
    except redis.RedisError as exc:
        log.warning("live point for deployment %s failed: %s", deployment_id, exc)


def forget(deployment_id: int) -> None:
    """Drop a deleted deployment's live streams; best effort (they are trimmed anyway)."""
    try:
        _client(settings.REDIS_URL).delete(stream_key(deployment_id), points_key(deployment_id))
    except redis.RedisError as exc:
        log.warning("dropping deployment %s's live streams failed: %s", deployment_id, exc)


class _Publisher(threading.Thread):
    """Publishes on its own thread, in order: a writer (the engine agent storing tens of
    thousands of lines a second) never waits on Redis. A publish still pending when the
    process ends is not lost: readers fill gaps from the database."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="live-publisher")
        # Bounded: if Redis falls behind, writers wait (back-pressure) instead of memory growing.
        self.queue: queue.Queue[tuple[int, Entries]] = queue.Queue(maxsize=1000)

    def run(self) -> None:
        while True:
            deployment_id, entries = self.queue.get()
            publish_entries(deployment_id, entries if isinstance(entries, list) else entries())


_publisher: _Publisher | None = None
_publisher_lock = threading.Lock()


def publish_later(deployment_id: int, wire_events: list[dict[str, Any]]) -> None:
    """publish() on the process's publisher thread (started on first use)."""
    publish_entries_later(deployment_id,
                          [(e["seq"], e["kind"], wire_json(e)) for e in wire_events])


def publish_entries_later(deployment_id: int, entries: Entries) -> None:
    """publish_entries() on the process's publisher thread (started on first use); entries
    given as a function are made there."""
    global _publisher
    with _publisher_lock:
        if _publisher is None or not _publisher.is_alive():
            _publisher = _Publisher()
            _publisher.start()
    _publisher.queue.put((deployment_id, entries))


def blocking_reader(block_s: float) -> aioredis.Redis:
    """A client for XREAD BLOCK of block_s: its reply may take that long plus the usual
    timeout (redis-py's default 5 s timeout, shorter than the block, cut every quiet read)."""
    timeout = block_s + settings.REDIS_SOCKET_TIMEOUT_S
    return aioredis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=timeout,
        socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT_S, socket_keepalive=True)


def seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[1])
