"""The threads of one engine's follower (appliance/runtime/follower.py): the reader of its
output, the shipper that hands batches to the sink while the next lines are parsed, and the
/health poller; the sink they write to (FollowSink) and the follower's options."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from appliance.logs.causes import Diagnosis
from appliance.runtime.client import EngineClient
from appliance.runtime.containers import LogLine
from appliance.runtime.cursor import Cursor

READ_AHEAD_LINES = 50_000  # lines read from Docker and not yet parsed, at most
MAX_PENDING_EVENTS = 20_000  # parsed and waiting for the database, at most (about 1 s)
# A trickle of lines is shipped at most this often, a line after a quiet spell at once: each
# batch costs a statement, a live publish and a wake-up of every viewer, and 1,000 lines/s
# shipped as they came made 500 batches a second (0.4 of a core in the agent:
# docs/performance.md, Log path).
LINGER_S = 0.005
LINGER_EVENTS = 1000  # a batch this large goes without lingering
# After two batches in a row of BUSY_EVENTS or more (some 15,000 events/s and up), the next
# gathers for up to BUSY_LINGER_S: at 10,000 decode lines/s, batches of 160 events every
# 8 ms cost more than their rows (each is a statement, a Redis call and a wake-up of the
# live feed: docs/performance.md, Log path). A trickle (1,000 lines/s:
# batches of 10) keeps LINGER_S, and so does the batch after a single large one (a stall,
# not a busy engine).
BUSY_EVENTS = 100
BUSY_LINGER_S = 0.02
# The shipper gives its database connection back after this long with nothing to write:
# on each catch-up, 1,000 lines/s took a pooled connection (and its check, a round trip)
# for nearly every batch, 0.37 ms of the agent's CPU each (docs/performance.md).
KEEP_CONNECTION_S = 1.0

# (stored kind, payload) pairs: appliance.events says what each kind carries.
Events = list[tuple[str, dict[str, Any]]]


@dataclass
class FollowOptions:
    ready_timeout_s: float = 3600.0
    health_poll_s: float = 1.0
    batch_s: float = 0.05
    batch_lines: int = 2000
    health_timeout_s: float = 5.0
    partials: bool = True  # live pieces of "\r" progress bars before ready


class FollowSink(Protocol):
    def ship(self, events: Events, cursor: Cursor | None) -> None: ...

    def advance(self, status: str) -> bool: ...

    def ready(self, engine_url: str) -> bool: ...

    def failed(self, diagnosis: Diagnosis, message: str, last_lines: list[str]) -> None: ...

    def keep_following(self) -> bool: ...

    def idle(self) -> None:
        """The shipper has written everything handed to it and had nothing more for
        KEEP_CONNECTION_S (called on its thread)."""


@runtime_checkable
class EncodingSink(FollowSink, Protocol):
    """A sink that makes events ready for its write on the follower's thread (`encode`, in
    order), so the shipper's write of one batch and the encoding of the next run side by
    side: with the encoding on the shipper's thread, the write of a busy engine's batches
    waited for it, 18 % of the shipper's time (profiled), and 10,000 decode lines/s were not
    stored as they came (docs/performance.md, Log path). What is handed while a write runs
    is shipped together, in order (`ship_encoded`)."""

    def encode(self, events: Events) -> Any: ...

    def ship_encoded(self, encoded: list[Any], cursor: Cursor | None) -> None: ...


class LineReader(threading.Thread):
    """Reads container output on its own thread so health polling never waits on it.

    Lines go into a deque the follower empties a batch at a time: a queue.Queue's lock and
    condition per line cost more than parsing a line (measured). The follower clears
    `arrived` before it takes lines, and the reader sets it after each append, so a line is
    never left waiting unseen."""

    def __init__(self, lines: Iterator[LogLine], name: str,
                 keep: Callable[[LogLine], bool] | None = None) -> None:
        super().__init__(daemon=True, name=name)
        self.lines = lines
        self.keep = keep  # which lines go into the buffer (None: all)
        self.buffer: deque[LogLine | None] = deque()
        self.arrived = threading.Event()
        self.error: Exception | None = None
        self.ending = threading.Event()

    def end(self) -> None:
        """Stop reading at the next line and close the stream (its connection to Docker)."""
        self.ending.set()

    def run(self) -> None:
        buffer, arrived, ending, keep = self.buffer, self.arrived, self.ending, self.keep
        try:
            for line in self.lines:
                if ending.is_set():
                    close = getattr(self.lines, "close", None)
                    if close is not None:
                        close()
                    break
                if keep is not None and not keep(line):
                    continue
                buffer.append(line)
                if not arrived.is_set():
                    arrived.set()
                while len(buffer) > READ_AHEAD_LINES:
                    time.sleep(0.005)  # back-pressure: Docker waits, memory stays bounded
        except Exception as exc:  # noqa: BLE001 - a broken stream is resumed by the caller
            self.error = exc
        finally:
            buffer.append(None)
            arrived.set()

    def take(self, limit: int, wait_s: float | None) -> list[LogLine | None]:
        """Up to `limit` lines (None: the stream ended); wait up to wait_s for a first one."""
        if not self.buffer:
            if not wait_s:
                return []
            self.arrived.wait(wait_s)
        self.arrived.clear()
        buffer = self.buffer
        return [buffer.popleft() for _ in range(min(limit, len(buffer)))]


class Shipper(threading.Thread):
    """Ships to the sink on its own thread, so the next lines are read and parsed while the
    database writes (the write was 40 % of the follower's time, profiled). What the follower
    hands over while a write runs is shipped together by the next one (group commit): a
    busy engine's batches grow with the write's cost, a quiet one's line goes at once.
    Any other sink call waits for what is handed over first (flush), so the sink sees
    everything in the order it did before. A failed ship (the lease lost) is raised to the
    follower at its next ship or flush; nothing after it is shipped."""

    def __init__(self, sink: FollowSink) -> None:
        super().__init__(daemon=True, name="engine-log-shipper")
        self.sink = sink
        self.encoding = sink if isinstance(sink, EncodingSink) else None
        self.changed = threading.Condition()
        self.handed: list[Any] = []  # the follower's batches, encoded where the sink does
        self.count = 0  # their events
        self.cursor: Cursor | None = None
        self.pending = self.busy = self.closed = self.flushing = False
        self.error: BaseException | None = None
        self.last_ship = 0.0
        self.busy_batches = 0  # batches of BUSY_EVENTS or more in a row

    def run(self) -> None:
        try:
            self._ship_all()
        finally:
            self._idle()

    def _idle(self) -> None:
        try:
            self.sink.idle()
        except BaseException as exc:  # noqa: BLE001 - raised in the follower's thread
            self.error = self.error or exc

    def _ship_all(self) -> None:
        holding = True  # the sink may hold a connection (given back on idle)
        while True:
            with self.changed:
                if not self.pending and not self.closed and holding:
                    self.changed.wait(KEEP_CONNECTION_S)
                quiet = not self.pending
            if quiet and holding:
                self._idle()  # nothing more to write for a while
                holding = False
            with self.changed:
                while not self.pending and not self.closed:
                    self.changed.wait()
                if not self.pending:
                    return
                self._linger()
                self.last_ship = time.monotonic()
                handed, cursor = self.handed, self.cursor
                self.busy_batches = self.busy_batches + 1 if self.count >= BUSY_EVENTS else 0
                self.handed, self.count, self.cursor = [], 0, None
                self.pending, self.busy = False, True
                self.changed.notify_all()
            holding = True
            try:
                if self.error is None:
                    self._ship(handed, cursor)
            except BaseException as exc:  # noqa: BLE001 - raised in the follower's thread
                self.error = exc
            finally:
                with self.changed:
                    self.busy = False
                    self.changed.notify_all()

    def _ship(self, handed: list[Any], cursor: Cursor | None) -> None:
        if self.encoding is not None:
            self.encoding.ship_encoded(handed, cursor)
        else:
            self.sink.ship(handed[0] if len(handed) == 1 else
                           [event for events in handed for event in events], cursor)

    def _linger(self) -> None:
        """Wait (holding `changed`) until LINGER_S after the last ship began, gathering what
        comes meanwhile (BUSY_LINGER_S while busy); a large batch, a flush or the close cuts
        it short."""
        due = self.last_ship + (BUSY_LINGER_S if self.busy_batches >= 2 else LINGER_S)
        while (not self.closed and not self.flushing and self.count < LINGER_EVENTS
               and (left := due - time.monotonic()) > 0):
            self.changed.wait(left)

    def ship(self, events: Events, cursor: Cursor | None) -> None:
        self._raise()
        item = events if self.encoding is None else self.encoding.encode(events)
        with self.changed:
            # Back-pressure: a database far behind slows the follower, and the lines wait
            # in the reader's bounded buffer rather than here.
            while self.count >= MAX_PENDING_EVENTS:
                self.changed.wait()
            self.handed.append(item)
            self.count += len(events)
            self.cursor = cursor or self.cursor  # cursors only move forward
            self.pending = True
            self.changed.notify_all()

    def flush(self) -> None:
        with self.changed:
            self.flushing = True
            self.changed.notify_all()
            while self.pending or self.busy:
                self.changed.wait()
            self.flushing = False
        self._raise()

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()
        self.join(timeout=60)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error


class HealthPoller(threading.Thread):
    """Polls /health on its own thread until it answers 200. On the follower's thread a
    slow answer (an engine loading may take the client's whole timeout) held every line
    behind it for that long."""

    def __init__(self, connect: Callable[[], EngineClient | None], every_s: float) -> None:
        super().__init__(daemon=True, name="engine-health")
        self.connect = connect
        self.every_s = every_s
        self.client: EngineClient | None = None
        self.healthy = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.client = self.client or self.connect()
            if self.client is not None and self.client.health() == 200:
                self.healthy.set()
                return
            self.stopped.wait(self.every_s)
