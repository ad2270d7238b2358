"""The routing table's two watches (web/gateway/routing.py), each with a connection of its
own, and each saying whether it can be trusted now: an answer to its own ping or query
within its stale bound is what proves it would carry a change (a hung connection carries
none).

- EpochWatch: the key epoch's Redis subscription. While it is not known good (not yet made,
  Redis restarting, silent for over EPOCH_WATCH_STALE_S) every request reads the epoch from
  Redis instead.
- RoutesWatch: a LISTEN on ROUTES_CHANNEL, which a trigger on the deployments table
  (migration gateway 0002) notifies; its liveness query reads each host's heartbeat. The
  once-a-second read of the whole table it replaces, started by a request, ran beside that
  very request: it was in the tail of the gateway's time to first byte
  (bench/gateway_overhead.py).
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
from django.db import connections

from web.gateway.selectors import HEARTBEATS_SQL
from web.gateway.services import KEYS_EPOCH, keys_channel

EPOCH_WATCH_POLL_S = 1.0
EPOCH_WATCH_STALE_S = 3.0
ROUTES_TTL_S = 1.0
ROUTES_SAFETY_S = 30.0
ROUTES_WATCH_POLL_S = 1.0
ROUTES_WATCH_STALE_S = 3.0
# The channel migration gateway 0002's trigger notifies (tests/gateway/test_routing.py
# checks that a change reaches a watch, so the two cannot drift apart unnoticed).
ROUTES_CHANNEL = "appliance_gateway_routes"

log = logging.getLogger(__name__)


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
