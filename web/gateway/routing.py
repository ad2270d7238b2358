"""The gateway's hot path without the database: what admission answered, kept in the
process, so a request with a known key costs one Redis round trip before the engine.

- Keys: a grant is cached by the key's digest together with the key epoch it was read at.
  Every request reads the epoch from Redis (in the same round trip as its rate-limit
  counter); services.apikey_revoke bumps it, so a revoked key stops at once, in every panel
  process. A grant is read again after GRANT_TTL_S anyway (an owner's role change).
- Deployments: the routing table (every active deployment's model name, status and engine
  URL) is read at most every ROUTES_TTL_S; a model missing from it is looked up afresh
  before the answer is 404, so a deployment that just became ready is found at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings

from web.gateway import admission
from web.gateway.admission import Caller, Refusal
from web.gateway.selectors import Target, secret_digest
from web.gateway.services import KEYS_EPOCH, rate_limit_key

# The key epoch, and the one-minute counter taken (its expiry set on the window's first use).
_EPOCH_AND_COUNT = """
local used = redis.call("INCR", KEYS[2])
if used == 1 then redis.call("EXPIRE", KEYS[2], 61) end
return {redis.call("GET", KEYS[1]), used}
"""
GRANT_TTL_S = 60.0
ROUTES_TTL_S = 1.0
MAX_GRANTS = 10_000


def _thread(fn):  # type: ignore[no-untyped-def]
    # Not thread_sensitive: these calls are independent and each hands its connection back.
    return sync_to_async(fn, thread_sensitive=False)


@dataclass
class Routing:
    redis: aioredis.Redis
    grants: dict[str, tuple[Any, float, Caller]] = field(default_factory=dict)
    table: list[Target] = field(default_factory=list)
    table_at: float = float("-inf")

    async def key_caller(self, secret: str) -> tuple[Caller | Refusal, int | None]:
        """The key's caller, and its requests in this minute (None: no limit checked)."""
        digest = secret_digest(secret)
        cached = self.grants.get(digest)
        epoch, used = await self._epoch_and_count(cached[2] if cached else None)
        if cached and cached[0] == epoch and time.monotonic() - cached[1] < GRANT_TTL_S:
            return cached[2], used
        answer = await _thread(admission.key_caller)(secret=secret)
        if isinstance(answer, Refusal):
            self.grants.pop(digest, None)
            return answer, None
        if len(self.grants) >= MAX_GRANTS:
            self.grants.clear()
        self.grants[digest] = (epoch, time.monotonic(), answer)
        if used is None and answer.key and answer.key.rate_limit_per_minute:
            _, used = await self._epoch_and_count(answer)
        return answer, used

    async def _epoch_and_count(self, caller: Caller | None) -> tuple[Any, int | None]:
        """One round trip: the key epoch and, for a limited key, its count in this minute
        (one script, as a pipeline of three commands cost twice a plain GET here)."""
        key = caller.key if caller is not None else None
        if key is None or not key.rate_limit_per_minute:
            return await self.redis.get(KEYS_EPOCH), None
        counter, _ = rate_limit_key(key_id=key.id)
        epoch, used = await self.redis.eval(_EPOCH_AND_COUNT, 2, KEYS_EPOCH, counter)
        return epoch, int(used)

    async def targets(self, *, model: str | None = None) -> list[Target]:
        """The routing table; read afresh when stale or when it does not know `model`."""
        stale = time.monotonic() - self.table_at > ROUTES_TTL_S
        if stale or (model is not None and all(t.model != model for t in self.table)):
            self.table = await _thread(admission.routes)()
            self.table_at = time.monotonic()
        return self.table


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
    return found
