"""The panel loop: the duties that span the whole panel, joined hosts included, run by one
process of its own (`python3 -m worker.loop`, compose `loop`).

- every tick (LOOP_TICK_S, 1 s): the rolling changes' next steps
  (web/deployments/services/rolling.py `rolling_tick`, which reads the gateway's in-flight
  counters in Redis) and the re-queue of builds no live worker holds
  (web/builder/requeue.py);
- every SWEEP_EVERY_S: the Tune sweep (web/benchmarks/tune_task.py `tune_sweep`);
- every PRUNE_EVERY_S: the metric series' compaction and retention and the event log's
  retention (on a thread of its own);
- at its start and every OWN_HOST_EVERY_S (hourly): `manage.py ownhost`'s work
  (web/fleet/tokenfiles.py), a usable join token for the panel's own host
  (APPLIANCE_HOST_NAME) in settings.OWN_HOST_TOKEN_FILE, which that host's agent joins with.
  Only the file's path and the token's expiry are logged. A file that cannot be written
  (or a bad host name) is logged once, as one warning, and tried again an hour on.

One copy acts. It holds a PostgreSQL session advisory lock on a connection of its own
(outside Django's pool, whose connections are handed back and closed at will) for as long
as that session lives; a second copy tries the lock each tick and acts once the first's
session has ended, which a killed process's does with its connection. A copy whose lock
connection fails stops acting until it holds the lock again. The lock saves work; it does
not make the duties correct: each is already safe when two run at once (conditional
UPDATEs; a roll's steps under replica 0's row lock).

Every wait is bounded: the lock connection's connect, statements and TCP (LOCK_TIMEOUT_S),
Redis's socket (REDIS_SOCKET_TIMEOUT_S), Django's pool, and each statement of the process's
other connections (worker/loop.py sets a statement timeout). A duty's exception is logged
and the duty is tried again the next tick; nothing a duty raises ends the loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.db import connection as db_connection
from django.db import connections
from django.utils import timezone

from web.benchmarks.tune_task import tune_sweep
from web.builder.requeue import builds_requeue_dead
from web.deployments.services.metrics import metrics_prune
from web.deployments.services.retention import events_prune_in_background
from web.deployments.services.rolling import rolling_tick
from web.fleet.services import FleetError
from web.fleet.tokenfiles import own_host_token_keep

log = logging.getLogger(__name__)

# The advisory lock's key: one per database, so one per install.
LOCK_KEY = int.from_bytes(b"sd-loop!", "big")
LOCK_TIMEOUT_S = 5  # connect, each statement, and TCP's wait for an answer
SWEEP_EVERY_S = 10.0
PRUNE_EVERY_S = 600.0
OWN_HOST_EVERY_S = 3600.0  # a token is replaced with a day left (OWN_HOST_RENEW_BEFORE)


@dataclass
class Duty:
    """A duty and how often it runs (0: every tick). `due` is the monotonic time it runs
    next; a run that raises leaves it due, so the next tick tries again."""

    name: str
    every_s: float
    run: Callable[[], Any]
    due: float = 0.0


class LoopLock:
    """The session advisory lock the acting copy holds, on a psycopg connection of its own.

    `held()` each tick: it takes the lock when it is free, and while it is held checks that
    the session still lives (the lock lives exactly as long). Never raises; every call is
    bounded by LOCK_TIMEOUT_S."""

    def __init__(self, key: int = LOCK_KEY, alias: str = "default") -> None:
        self.key = key
        self.alias = alias
        self.conn: psycopg.Connection[Any] | None = None
        self._held = False
        self._failing = False  # said that the database cannot be reached

    def address(self) -> dict[str, Any]:
        """Where the lock's connection goes: Django's database, outside its pool."""
        db = connections[self.alias].settings_dict
        if db["ENGINE"] != "django.db.backends.postgresql":
            raise RuntimeError("the panel loop needs PostgreSQL (APPLIANCE_DATABASE_URL)")
        return {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"],
                "host": db["HOST"], "port": db["PORT"]}

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            **self.address(), autocommit=True,
            connect_timeout=LOCK_TIMEOUT_S, application_name="appliance panel loop",
            options=f"-c statement_timeout={LOCK_TIMEOUT_S * 1000}",
            # A server gone without a word (a pulled cable) is seen within seconds, not
            # after the kernel's two hours: the lock is then taken as lost.
            keepalives=1, keepalives_idle=LOCK_TIMEOUT_S, keepalives_interval=1,
            keepalives_count=3, tcp_user_timeout=LOCK_TIMEOUT_S * 1000)

    def held(self) -> bool:
        try:
            if self.conn is None:
                self.conn = self._connect()
            if self._held:
                self.conn.execute("SELECT 1")
            else:
                row = self.conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                self._held = bool(row and row[0])
        except (psycopg.Error, OSError) as exc:
            if self._held:
                log.warning("panel loop: the lock's connection failed (%s); not acting until "
                            "the lock is held again", exc)
            elif not self._failing:  # said once an outage, not each tick
                log.warning("panel loop: cannot reach the database for the lock (%s); "
                            "trying each tick", exc)
            self._failing = True
            self.close()
            return False
        self._failing = False
        return self._held

    @property
    def backend_pid(self) -> int | None:
        """The lock session's server process (pg_stat_activity's pid), while connected."""
        return self.conn.info.backend_pid if self.conn is not None else None

    def close(self) -> None:
        """End the session, and the lock with it: another copy may take it at once."""
        conn, self.conn, self._held = self.conn, None, False
        if conn is not None:
            # A connection already broken has nothing left to end.
            with contextlib.suppress(psycopg.Error, OSError):
                conn.close()


class _Rolls:
    """rolling_tick with the gateway's in-flight counters (Redis), its client made once."""

    def __init__(self) -> None:
        self.client: Any = None

    def __call__(self) -> None:
        if self.client is None:
            self.client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=settings.REDIS_SOCKET_TIMEOUT_S,
                socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT_S)
        rolling_tick(client=self.client)


def _sweep_tunes() -> None:
    for line in tune_sweep():
        log.warning("%s", line)


def _prune() -> None:
    metrics_prune(now=time.time())
    events_prune_in_background()  # the event log's retention, on a thread of its own


def _own_host_token() -> None:
    """The own host's join token kept in its file. A file error (an unwritable folder) or a
    bad APPLIANCE_HOST_NAME is said in one warning and left for the next run, an hour on:
    retrying each tick would not help and would fill the log. A database error raises, as
    any duty's does (tried again next tick)."""
    path = Path(settings.OWN_HOST_TOKEN_FILE)
    try:
        kept = own_host_token_keep(path=path, host_name=settings.HOST_NAME)
    except OSError as exc:
        log.warning("panel loop: cannot keep the own host's join token in %s: %s (%s); its "
                    "agent cannot join with it; tried again in an hour", path,
                    exc.strerror or exc, exc.filename or path)
        return
    except FleetError as exc:
        log.warning("panel loop: no join token for the own host: %s: %s; tried again in "
                    "an hour", exc.field, exc)
        return
    host = kept.token.host_name
    expires = kept.token.expires_at.strftime("%Y-%m-%d %H:%M")
    if kept.made:
        log.info("panel loop: a join token for the own host %s (expires %s UTC) is in %s "
                 "(the one there was %s)", host, expires, path, kept.why)
    else:
        log.info("panel loop: the own host %s's join token in %s is usable until %s UTC: "
                 "kept", host, path, expires)


def default_duties() -> list[Duty]:
    return [
        Duty("rolling changes", 0, _Rolls()),
        Duty("builds' re-queue", 0, lambda: builds_requeue_dead(now=timezone.now())),
        Duty("Tune sweep", SWEEP_EVERY_S, _sweep_tunes),
        Duty("retention", PRUNE_EVERY_S, _prune),
        Duty("own host's join token", OWN_HOST_EVERY_S, _own_host_token),
    ]


@dataclass
class PanelLoop:
    """run() ticks until `stop` is set, acting only while `lock` is held."""

    duties: list[Duty] = field(default_factory=default_duties)
    lock: LoopLock = field(default_factory=LoopLock)
    acting: threading.Event = field(default_factory=threading.Event)  # tests read it
    _waiting: bool = False  # said that another copy holds the lock

    def run(self, stop: threading.Event, tick_s: float = 1.0) -> None:
        log.info("panel loop running (tick %.2f s)", tick_s)
        try:
            while not stop.is_set():
                self.tick()
                stop.wait(tick_s)
        finally:
            self.acting.clear()
            self.lock.close()
            db_connection.close()

    def tick(self) -> None:
        if not self.lock.held():
            if self.lock.conn is not None and (self.acting.is_set() or not self._waiting):
                log.info("panel loop: another copy holds lock %s; trying each tick",
                         self.lock.key)
            self._waiting = self.lock.conn is not None
            self.acting.clear()
            return
        self._waiting = False
        if not self.acting.is_set():
            log.info("panel loop: acting (holding lock %s)", self.lock.key)
            self.acting.set()
        for duty in self.duties:
            now = time.monotonic()
            if now < duty.due:
                continue
            try:
                duty.run()
            except Exception:  # noqa: BLE001 - the database or Redis is back next tick
                log.exception("panel loop: %s failed; tried again next tick", duty.name)
                db_connection.close()  # a broken connection is replaced at the next use
                continue
            duty.due = now + duty.every_s


def panel_loop(stop: threading.Event, tick_s: float | None = None) -> None:
    """The panel loop's entry point (worker/loop.py)."""
    PanelLoop().run(stop, tick_s=settings.LOOP_TICK_S if tick_s is None else tick_s)
