"""The gateway's hot path without the database: what admission answered, kept in the
process, so a request with a known key costs one Redis round trip before the engine.

- Keys: a grant is cached by the key's digest together with the key epoch it was read at.
  services.apikey_revoke bumps the epoch and publishes it, so a revoked key stops at once,
  in every panel process: each process knows the epoch from its subscription (EpochWatch,
  web/gateway/watches.py) without a round trip while that is known good, else reads it
  from Redis per request. A key with a rate limit takes a round trip per lease of its
  minute's requests (LEASE_SHARE), not per request. A grant is read again in the
  background once GRANT_TTL_S old (an owner's role change); the request that finds it old
  is answered from it.
- Deployments: the routing table (every active deployment's model name, status and engine
  URL) is read again when PostgreSQL says a row of it changed (RoutesWatch, beside
  EpochWatch): the request that comes after a change waits for the new table. While that
  watch is not known good, the table is read again in the background once ROUTES_TTL_S
  old, and the request that finds it stale is answered from it; known good, it is still
  read again every ROUTES_SAFETY_S. A model missing from it is looked up afresh before the
  answer is 404. Concurrent reads share one database query.
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
  counter in Redis (web/deployments/inflight.py) off the request's path
  (web/gateway/inflight_counter.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from web.gateway import admission
from web.gateway.admission import Caller, Refusal
from web.gateway.bounds import PROBE_TIMEOUT_S, healthy
from web.gateway.inflight_counter import InflightCounter
from web.gateway.selectors import Target, secret_digest
from web.gateway.services import KEYS_EPOCH, rate_limit_key
from web.gateway.watches import ROUTES_TTL_S, EpochWatch, RoutesWatch

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
ROUTES_SAFETY_S = 30.0
MAX_GRANTS = 10_000
# A replica that failed a request before answering (refused, reset, 502/503) gets no client
# request until its /health answers 200 again, asked this often in the background (the
# agent's status change, through the trigger, takes a dead engine out of the table for good).
PROBE_S = 0.5
# Prefix affinity gives way to the least loaded replica when its own load is more than this
# many requests above it (a shared-prefix burst must not pile onto one replica).
AFFINITY_SLACK = 2

log = logging.getLogger(__name__)


def _thread(fn):  # type: ignore[no-untyped-def]
    # Not thread_sensitive: these calls are independent and each hands its connection back.
    return sync_to_async(fn, thread_sensitive=False)


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
    background: set[asyncio.Future[Any]] = field(default_factory=set)
    counter: InflightCounter = field(init=False)

    def __post_init__(self) -> None:
        self.lease_script = self.redis.register_script(_LEASE)
        self.counter = InflightCounter(redis=self.redis, spawn=self._spawn)

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
        self.counter.count(row, 1)

    def end(self, target: Target) -> None:
        row = target.deployment_id
        left = self.outstanding.get(row, 1) - 1
        if left > 0:
            self.outstanding[row] = left
        else:
            self.outstanding.pop(row, None)
        self.counter.count(row, -1)

    def flush_now(self) -> None:
        """The in-flight counters' pending changes, sent at once (the process is ending)."""
        self.counter.flush_now()

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
