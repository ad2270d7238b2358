"""The gateway's hot path without the database: what admission answered, kept in the
process, so a request with a known key costs one Redis round trip before the engine.

- Keys: a grant is cached by the key's digest together with the key epoch it was read at.
  services.apikey_revoke bumps the epoch and publishes it, so a revoked key stops at once,
  in every panel process. Each process holds a subscription (EpochWatch) and knows the
  epoch without a round trip; while that subscription is not known good (not yet made,
  Redis restarting, silent for over EPOCH_WATCH_STALE_S) every request reads the epoch from
  Redis instead. A key with a rate limit takes a round trip per lease of its minute's
  requests (LEASE_SHARE), not per request. A grant is read again in the background once
  GRANT_TTL_S old (an owner's role change); the request that finds it old is answered from it.
- Deployments: the routing table (every active deployment's model name, status and engine
  URL) is read again when PostgreSQL says a row of it changed: a trigger on the deployments
  table (migration gateway 0002) notifies ROUTES_CHANNEL, and each process LISTENs on a
  connection of its own (RoutesWatch). The request that comes after a change waits for the
  new table. While that connection is not known good, the table is read again once it is
  ROUTES_TTL_S old, in the background, as before the watch: the request that finds it stale
  is answered from it. That once-a-second read, started by a request, ran beside that very
  request: it was in the tail of the gateway's time to first byte (bench/gateway_overhead.py).
  Known good, the table is still read again every ROUTES_SAFETY_S. A model missing from it is
  looked up afresh before the answer is 404. Concurrent reads share one database query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from web.gateway import admission
from web.gateway.admission import Caller, Refusal
from web.gateway.selectors import Target, secret_digest
from web.gateway.services import KEYS_EPOCH, keys_channel, rate_limit_key

# A lease of up to ARGV[2] requests from a key's one-minute window of ARGV[1]: never more
# than the window has left, so all processes together never pass the limit (the window's
# counter expires with it).
_LEASE = """
local used = tonumber(redis.call("GET", KEYS[1]) or "0")
local grant = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used)
if grant <= 0 then return 0 end
if redis.call("INCRBY", KEYS[1], grant) == grant then redis.call("EXPIRE", KEYS[1], 61) end
return grant
"""
# The requests a process leases at once: a hundredth of the limit, so a limited key costs a
# round trip per lease instead of per request, and requests leased by a process that then
# gets none leave others short by at most this many each (a limit of 2 leases one at a time).
LEASE_SHARE = 100
GRANT_TTL_S = 60.0
EPOCH_WATCH_POLL_S = 1.0
EPOCH_WATCH_STALE_S = 3.0
ROUTES_TTL_S = 1.0
ROUTES_SAFETY_S = 30.0
ROUTES_WATCH_POLL_S = 1.0
ROUTES_WATCH_STALE_S = 3.0
# The channel migration gateway 0002's trigger notifies (tests/gateway/test_routing.py
# checks that a change reaches a watch, so the two cannot drift apart unnoticed).
ROUTES_CHANNEL = "appliance_gateway_routes"
MAX_GRANTS = 10_000

log = logging.getLogger(__name__)


def _thread(fn):  # type: ignore[no-untyped-def]
    # Not thread_sensitive: these calls are independent and each hands its connection back.
    return sync_to_async(fn, thread_sensitive=False)


@dataclass
class EpochWatch:
    """The key epoch as the subscription last told it, and whether that can be trusted now:
    the watching task marks each pass (at least every EPOCH_WATCH_POLL_S)."""

    epoch: Any = None
    good: bool = False
    seen_at: float = float("-inf")
    task: asyncio.Task[None] | None = None

    def current(self) -> tuple[bool, Any]:
        """(True, epoch) when the subscription vouches for it, else (False, None)."""
        if self.good and time.monotonic() - self.seen_at < EPOCH_WATCH_STALE_S:
            return True, self.epoch
        return False, None

    def start(self, url: str) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._watch(url))

    async def _watch(self, url: str) -> None:
        while True:
            # Its own connection, without the pool's socket timeout (it sits idle between
            # revocations). Its own PING each EPOCH_WATCH_POLL_S: the answer coming back is
            # what proves the subscription carries messages (a hung connection sends none).
            client = aioredis.Redis.from_url(url, socket_connect_timeout=5,
                                             socket_keepalive=True, client_name=WATCH_NAME)
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(keys_channel(client))
                    # Read after subscribing: a revocation in between is in one or the other.
                    self.epoch = await client.get(KEYS_EPOCH)
                    self.seen_at, self.good, ping_at = time.monotonic(), True, 0.0
                    while True:
                        if time.monotonic() >= ping_at:
                            await pubsub.ping(_PING)
                            ping_at = time.monotonic() + EPOCH_WATCH_POLL_S
                        message = await pubsub.get_message(timeout=EPOCH_WATCH_POLL_S / 2)
                        if message is None:
                            continue
                        if message["type"] == "message":
                            self.epoch = message["data"]
                        elif message["type"] == "pong" and message["data"] == _PING:
                            self.seen_at = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: per-request reads, retry
                log.warning("the gateway's key-epoch subscription failed (%s); reading the "
                            "epoch per request until it is back", exc)
            finally:
                self.good = False
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(EPOCH_WATCH_POLL_S)


_PING = b"epoch-watch"
WATCH_NAME = "appliance-gateway-epoch-watch"  # as Redis's CLIENT LIST names the connection


@dataclass
class RoutesWatch:
    """How many times PostgreSQL said the routing table changed (`changes`), and whether the
    LISTEN connection can be trusted now: it runs a trivial query each ROUTES_WATCH_POLL_S,
    and an answer is what proves the connection would carry a notification."""

    changes: int = 0
    good: bool = False
    seen_at: float = float("-inf")
    task: asyncio.Task[None] | None = None

    def current(self) -> tuple[bool, int]:
        """(True, changes) when the connection vouches for them, else (False, changes)."""
        trusted = self.good and time.monotonic() - self.seen_at < ROUTES_WATCH_STALE_S
        return trusted, self.changes

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        params = dict(connections.create_connection("default").get_connection_params())
        params.pop("cursor_factory", None)  # Django's sync cursor class
        params["application_name"] = ROUTES_WATCH_NAME  # as pg_stat_activity names it
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(**params, autocommit=True,
                                                             connect_timeout=5)
                async with conn:
                    await conn.execute(f"LISTEN {ROUTES_CHANNEL}")
                    # A change before the LISTEN was told to no one: count one.
                    self.changes += 1
                    self.seen_at, self.good = time.monotonic(), True
                    while True:
                        async for _ in conn.notifies(timeout=ROUTES_WATCH_POLL_S):
                            self.changes += 1
                        await asyncio.wait_for(conn.execute("SELECT 1"),
                                               ROUTES_WATCH_STALE_S)
                        self.seen_at = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: poll, retry
                log.warning("the gateway's routing-table watch failed (%s); reading the table "
                            "every %s s until it is back", exc, ROUTES_TTL_S)
            finally:
                self.good = False
            await asyncio.sleep(ROUTES_WATCH_POLL_S)


ROUTES_WATCH_NAME = "appliance-gateway-routes-watch"


@dataclass
class Routing:
    redis: aioredis.Redis
    watch: EpochWatch = field(default_factory=EpochWatch)
    routes_watch: RoutesWatch = field(default_factory=RoutesWatch)
    grants: dict[str, tuple[Any, float, Caller]] = field(default_factory=dict)
    regranting: set[str] = field(default_factory=set)
    # key id -> [window, requests leased and not yet used, a top-up in flight]
    leases: dict[int, list[Any]] = field(default_factory=dict)
    lease_script: Any = None  # _LEASE, sent by its digest (EVALSHA), not its text
    table: list[Target] = field(default_factory=list)
    table_at: float = float("-inf")
    table_changes: int = 0  # routes_watch.changes as it was when the table was read
    reading: asyncio.Task[list[Target]] | None = None

    def __post_init__(self) -> None:
        self.lease_script = self.redis.register_script(_LEASE)

    async def key_caller(self, secret: str) -> Caller | Refusal:
        """The key's caller (its rate limit is `take`'s)."""
        digest = secret_digest(secret)
        cached = self.grants.get(digest)
        epoch = await self.epoch()
        if cached and cached[0] == epoch:
            if time.monotonic() - cached[1] > GRANT_TTL_S and digest not in self.regranting:
                self.regranting.add(digest)
                task = asyncio.ensure_future(self._regrant(secret, digest, epoch))
                task.add_done_callback(_quiet)
            return cached[2]
        return await self._grant(secret, digest, epoch)

    async def take(self, *, key_id: int, limit: int) -> bool:
        """One request of the key's limit in this minute: from this process's lease, or a
        new lease when it is used up (False: the window has none left)."""
        counter, _ = rate_limit_key(key_id=key_id)
        lease = self.leases.get(key_id)
        if lease is None or lease[0] != counter:
            lease = self.leases[key_id] = [counter, 0, False]
        if lease[1] <= 0:
            # (the lease awaited before the sum: `lease[1] += await ...` would add to the
            # count as it was before the wait and undo what other requests took meanwhile)
            got = int(await self.lease_script(keys=[counter], args=[limit, _share(limit)]))
            lease[1] += got
            if lease[1] <= 0:
                return False
        lease[1] -= 1
        if lease[1] < _share(limit) // 2 and not lease[2] and _share(limit) > 1:
            lease[2] = True  # topped up before it runs out: the next requests wait for none
            task = asyncio.ensure_future(self._top_up(lease, limit))
            task.add_done_callback(_quiet)
        return True

    async def _top_up(self, lease: list[Any], limit: int) -> None:
        try:
            got = int(await self.lease_script(keys=[lease[0]], args=[limit, _share(limit)]))
            lease[1] += got
        finally:
            lease[2] = False

    async def _grant(self, secret: str, digest: str, epoch: Any) -> Caller | Refusal:
        """The key read from the database, kept for its epoch (a refusal is not kept)."""
        answer = await _thread(admission.key_caller)(secret=secret)
        if isinstance(answer, Refusal):
            self.grants.pop(digest, None)
            return answer
        if len(self.grants) >= MAX_GRANTS:
            self.grants.clear()
        self.grants[digest] = (epoch, time.monotonic(), answer)
        return answer

    async def _regrant(self, secret: str, digest: str, epoch: Any) -> None:
        try:
            await self._grant(secret, digest, epoch)
        finally:
            self.regranting.discard(digest)

    async def epoch(self) -> Any:
        """The key epoch: no round trip while the subscription vouches for it, else one."""
        known, epoch = self.watch.current()
        return epoch if known else await self.redis.get(KEYS_EPOCH)

    async def targets(self, *, model: str | None = None) -> list[Target]:
        """The routing table: read afresh (and waited for) before the first answer and when
        it does not know `model`; read again in the background when merely stale."""
        trusted, changes = self.routes_watch.current()
        known = self.table_at > float("-inf") and (
            model is None or any(t.model == model for t in self.table))
        if not known or (trusted and changes != self.table_changes):
            return await self._read()
        age = time.monotonic() - self.table_at
        if age > (ROUTES_SAFETY_S if trusted else ROUTES_TTL_S) and self.reading is None:
            task = asyncio.ensure_future(self._read())
            task.add_done_callback(_quiet)
        return self.table

    async def ended(self, *, model: str) -> Target | None:
        """The newest ended deployment that served `model`, read afresh: asked only when the
        table has none of that name, before the answer would be 404."""
        return await _thread(admission.ended_route)(model=model)

    def _read(self) -> asyncio.Task[list[Target]]:
        """The one read in flight (started when none is), awaited by every caller."""
        if self.reading is None:
            self.reading = asyncio.ensure_future(self._read_table())
        return self.reading

    async def _read_table(self) -> list[Target]:
        # Counted before the query: a change told while it runs makes the next request read
        # again, since the rows may predate it.
        changes = self.routes_watch.changes
        try:
            self.table = await _thread(admission.routes)()
            self.table_at, self.table_changes = time.monotonic(), changes
            return self.table
        finally:
            self.reading = None


def _share(limit: int) -> int:
    return max(1, limit // LEASE_SHARE)


def _quiet(task: asyncio.Future[Any]) -> None:
    """A background read that failed is logged; the next request tries again."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("the gateway's routing table could not be read: %s", task.exception())


_ROUTING: dict[int, Routing] = {}


def routing() -> Routing:
    """One per event loop (uvicorn runs one per process)."""
    loop = asyncio.get_running_loop()
    found = _ROUTING.get(id(loop))
    if found is None:
        # Blocking: a burst of requests waits for a pooled connection rather than failing
        # or opening hundreds (connecting is what timed out under a 1,000-stream burst).
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=64, timeout=60,
            socket_timeout=settings.REDIS_SOCKET_TIMEOUT_S)
        found = _ROUTING[id(loop)] = Routing(redis=aioredis.Redis(connection_pool=pool))
        found.watch.start(settings.REDIS_URL)
        if connections["default"].vendor == "postgresql":  # SQLite (development) polls
            found.routes_watch.start()
    return found
