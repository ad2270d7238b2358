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
- Replicas: a served name maps to the rows of one deployment (replica 0 and the rows with
  replica_of = it); `rotation` gives those in rotation now (ready, not draining, not on a
  lost host, not ejected after a failure) and `pick` chooses one: the fewest requests this
  process relays to it, with prefix affinity (the same first prompt block to the same
  replica, for its prefix cache) while that replica is within AFFINITY_SLACK of the least
  loaded. A host is lost when its last heartbeat (read by the watch connection each second,
  no request waits for it) is older than APPLIANCE_AGENT_SILENT_S. A row that failed a
  request before answering is ejected: no client request goes there until its /health
  answers again (probed each PROBE_S); the agent's status change (through the trigger)
  takes a dead engine out of the table for good. `begin`/`end` keep the per-row in-flight
  counter in Redis (web/deployments/inflight.py) off the request's path: the changes of
  INFLIGHT_FLUSH_S go out in one pipeline in the background, each send after the last.
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

from web.deployments.inflight import INFLIGHT_TTL_S, inflight_key
from web.gateway import admission
from web.gateway.admission import Caller, Refusal
from web.gateway.selectors import HEARTBEATS_SQL, Target, secret_digest
from web.gateway.services import KEYS_EPOCH, keys_channel, rate_limit_key
from web.gateway.upstream import PROBE_TIMEOUT_S, healthy

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
# A replica that failed a request before answering (refused, reset, 502/503) gets no client
# request until its /health answers 200 again, asked this often in the background (the
# agent's status change, through the trigger, takes a dead engine out of the table for good).
PROBE_S = 0.5
# Prefix affinity gives way to the least loaded replica when its own load is more than this
# many requests above it (a shared-prefix burst must not pile onto one replica).
AFFINITY_SLACK = 2
# The in-flight counters are changed this long after the relay's start and end, together:
# a rolling change waits for the routing notification and this before it trusts a 0.
INFLIGHT_FLUSH_S = 0.01

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
    # Each host's last heartbeat (Unix time, by Target.host_key) and when it was read: the
    # watch's own liveness query reads them, each ROUTES_WATCH_POLL_S.
    heartbeats: dict[str, float] = field(default_factory=dict)
    heartbeats_at: float = float("-inf")

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
                        cursor = await asyncio.wait_for(conn.execute(HEARTBEATS_SQL),
                                                        ROUTES_WATCH_STALE_S)
                        read_at = time.time()
                        self.heartbeats = {key: at for key, at in await cursor.fetchall()}
                        self.heartbeats_at = read_at
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
    groups: dict[int, list[Target]] = field(default_factory=dict)  # replica 0's id -> rows
    outstanding: dict[int, int] = field(default_factory=dict)  # row -> relayed by us now
    ejected: set[int] = field(default_factory=set)  # rows out until their /health answers
    turn: int = 0  # ties between equally loaded replicas go round
    # In-flight changes not yet sent to Redis, by row; the timer that sends them; the send
    # under way (the next one waits for it).
    inflight_pending: dict[int, int] = field(default_factory=dict)
    inflight_flush: asyncio.TimerHandle | None = None
    inflight_sending: asyncio.Future[Any] | None = None
    background: set[asyncio.Future[Any]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.lease_script = self.redis.register_script(_LEASE)

    # -- replicas

    def lost(self, target: Target) -> bool:
        """Whether the row's host has been silent past APPLIANCE_AGENT_SILENT_S, judged at
        the time its heartbeats were read (a table read long ago makes no host look lost)."""
        beat = self.routes_watch.heartbeats.get(target.host_key)
        return beat is not None and (self.routes_watch.heartbeats_at - beat
                                     > settings.AGENT_SILENT_S)

    def serving(self, target: Target) -> list[Target]:
        """Every row of `target`'s deployment in rotation (ready, not draining), whatever its
        host's last heartbeat or a failure of its own says: what a retry may fall back to."""
        return [t for t in self.groups.get(target.group_id) or [target] if t.in_rotation]

    def rotation(self, target: Target, *, exclude: tuple[int, ...] = (),
                 away_from: str = "") -> list[Target]:
        """The rows of `target`'s deployment that may take a new request now. Rows on a lost
        host, rows ejected after a failure, and (a retry's) rows on the host `away_from`
        whose replica just failed (a host that dies takes all its replicas with it, before
        its heartbeat says so) are left out while another row can serve; when none can,
        they are tried rather than refused."""
        ready = [t for t in self.serving(target) if t.deployment_id not in exclude]
        if len(ready) <= 1:
            return ready
        kept = [t for t in ready if not self.lost(t)] or ready
        if away_from:
            kept = [t for t in kept if t.host_key != away_from] or kept
        return [t for t in kept if t.deployment_id not in self.ejected] or kept

    def pick(self, rows: list[Target], *, affinity: int | None = None) -> Target:
        """The least loaded row (in this process), the prefix's own while within
        AFFINITY_SLACK of it; ties go round."""
        if len(rows) == 1:
            return rows[0]
        loads = self.outstanding
        least = min(loads.get(t.deployment_id, 0) for t in rows)
        if affinity is not None:
            own = max(rows, key=lambda t: _mix(affinity, t.deployment_id))
            if loads.get(own.deployment_id, 0) <= least + AFFINITY_SLACK:
                return own
        self.turn += 1
        for i in range(len(rows)):
            row = rows[(self.turn + i) % len(rows)]
            if loads.get(row.deployment_id, 0) == least:
                return row
        return rows[0]  # (unreachable: one row has the least load)

    def eject(self, target: Target, *, generate: bool = False) -> None:
        """Out of the rotation until its engine's /health answers 200 (or the table drops
        the row, or gives it another engine). `generate`: it timed out a request, so it may
        be an engine whose HTTP server answers while its scheduler is hung (SGLang's
        /health is 200 then): back only once /health_generate makes a token, within the
        gateway's first-byte timeout."""
        if target.deployment_id not in self.ejected:
            self.ejected.add(target.deployment_id)
            self._spawn(self._probe(target, generate))

    async def _probe(self, target: Target, generate: bool = False) -> None:
        url = target.engine_url.rstrip("/") + ("/health_generate" if generate else "/health")
        timeout_s = settings.GATEWAY_FIRST_BYTE_TIMEOUT_S if generate else PROBE_TIMEOUT_S
        try:
            while True:
                await asyncio.sleep(PROBE_S)
                now = next((t for t in self.table if t.deployment_id == target.deployment_id),
                           None)
                if now is None or now.engine_url != target.engine_url:
                    return  # gone from the table, or a new engine: judged afresh
                if await healthy(url, timeout_s):
                    return
        finally:
            self.ejected.discard(target.deployment_id)

    def companion(self, target: Target) -> Target | None:
        """A row in rotation of the deployment `target`'s spec names as its companion (the
        newest such deployment), or None."""
        return next((t for t in self.table if t.name == target.companion and t.in_rotation
                     and t.group_id != target.group_id), None)

    def begin(self, target: Target) -> None:
        """A request relayed to the row from now: counted here and, within INFLIGHT_FLUSH_S
        and in the background, in its Redis in-flight counter."""
        row = target.deployment_id
        self.outstanding[row] = self.outstanding.get(row, 0) + 1
        self._count(row, 1)

    def end(self, target: Target) -> None:
        row = target.deployment_id
        left = self.outstanding.get(row, 1) - 1
        if left > 0:
            self.outstanding[row] = left
        else:
            self.outstanding.pop(row, None)
        self._count(row, -1)

    def _count(self, row: int, by: int) -> None:
        # Changes within INFLIGHT_FLUSH_S go out together, in one pipeline, and a request
        # that begins and ends within it costs Redis nothing: a script per change cost
        # the panel about a millisecond of CPU a request (bench/gateway_overhead.py).
        self.inflight_pending[row] = self.inflight_pending.get(row, 0) + by
        if self.inflight_flush is None:
            self.inflight_flush = asyncio.get_running_loop().call_later(
                INFLIGHT_FLUSH_S, self._flush)

    def flush_now(self) -> None:
        """Send the counters' pending changes at once, not after INFLIGHT_FLUSH_S (the
        process is ending: a timer not yet run would never send them)."""
        if self.inflight_flush is not None:
            self.inflight_flush.cancel()
            self._flush()

    def _flush(self) -> None:
        self.inflight_flush = None
        changes = {row: by for row, by in self.inflight_pending.items() if by}
        self.inflight_pending = {}
        if changes:
            self.inflight_sending = self._spawn(self._send(changes, self.inflight_sending))

    async def _send(self, changes: dict[int, int], after: asyncio.Future[Any] | None) -> None:
        if after is not None and not after.done():  # in order: a -1 never lands before its +1
            with contextlib.suppress(Exception):
                await after
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for row, by in changes.items():
                    key = inflight_key(deployment_id=row)
                    pipe.incrby(key, by)
                    pipe.expire(key, INFLIGHT_TTL_S)
                await pipe.execute()
        except Exception:
            for row, by in changes.items():  # sent with the next flush instead
                self.inflight_pending[row] = self.inflight_pending.get(row, 0) + by
            raise

    def _spawn(self, work: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self.background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Future[Any]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("the gateway's in-flight counter could not be changed: %s",
                        task.exception())

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
            read_at = time.time()
            table, heartbeats = await _thread(admission.routes_and_heartbeats)()
            groups: dict[int, list[Target]] = {}
            for target in table:
                groups.setdefault(target.group_id, []).append(target)
            for rows in groups.values():
                rows.sort(key=lambda t: t.deployment_id)  # replica 0 first, then by age
            self.table, self.groups = table, groups
            if read_at > self.routes_watch.heartbeats_at:
                self.routes_watch.heartbeats = heartbeats
                self.routes_watch.heartbeats_at = read_at
            self.table_at, self.table_changes = time.monotonic(), changes
            return self.table
        finally:
            self.reading = None


_M64 = (1 << 64) - 1


def _mix(affinity: int, row: int) -> int:
    """A row's score for a prefix (rendezvous hashing: the highest wins, and a row leaving
    moves only its own prefixes). splitmix64's finaliser, the same in every process."""
    x = (affinity ^ (row * 0x9E3779B97F4A7C15)) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


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
