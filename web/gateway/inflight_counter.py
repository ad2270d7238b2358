"""A process's changes to the rows' in-flight counters in Redis (web/deployments/inflight.py),
kept off the request's path: the changes of INFLIGHT_FLUSH_S go out together, in one
pipeline, in the background, each send after the last (a -1 never lands before its +1),
and a request that begins and ends within it costs Redis nothing (a script per change cost
the panel about a millisecond of CPU a request: bench/gateway_overhead.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from web.deployments.inflight import INFLIGHT_TTL_S, inflight_key

# The in-flight counters are changed this long after the relay's start and end, together:
# a rolling change waits for the routing notification and this before it trusts a 0.
INFLIGHT_FLUSH_S = 0.01


@dataclass
class InflightCounter:
    redis: aioredis.Redis
    # Runs a send in the background and holds it until done (the routing table's tasks).
    spawn: Callable[[Any], asyncio.Future[Any]]
    # Changes not yet sent, by row; the timer that sends them; the send under way.
    pending: dict[int, int] = field(default_factory=dict)
    flush: asyncio.TimerHandle | None = None
    sending: asyncio.Future[Any] | None = None

    def count(self, row: int, by: int) -> None:
        self.pending[row] = self.pending.get(row, 0) + by
        if self.flush is None:
            self.flush = asyncio.get_running_loop().call_later(INFLIGHT_FLUSH_S, self._flush)

    def flush_now(self) -> None:
        """Send the pending changes at once, not after INFLIGHT_FLUSH_S (the process is
        ending: a timer not yet run would never send them)."""
        if self.flush is not None:
            self.flush.cancel()
            self._flush()

    def _flush(self) -> None:
        self.flush = None
        changes = {row: by for row, by in self.pending.items() if by}
        self.pending = {}
        if changes:
            self.sending = self.spawn(self._send(changes, self.sending))

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
                self.pending[row] = self.pending.get(row, 0) + by
            raise
