"""Many SSE viewers of one deployment while its events are appended, against a
production-like panel.

    python bench/load_sse.py --database-url postgres://USER@HOST:PORT/DB \\
        --redis-url redis://HOST:PORT/N [--viewers 200] [--rate 50] [--batch 1] \\
        [--seconds 20] [--quiet 0] [--leave drop|end] [--rounds 1] [--decode] \\
        [--slow 0] [--profile DIR]

The panel is served as its image serves it (`docker/panel/entrypoint.sh serve`: uvicorn,
one process per core up to 4, each with its own live feed; --server-env
APPLIANCE_WEB_WORKERS=1 for one). The viewers log in once (a session cookie) and open
the event stream of a fresh deployment from its current end (Last-Event-ID), as browsers
do. They may first be held --quiet seconds without events (the keep-alive path); then
another process appends --rate events/s in calls of --batch events through
services.events_append (the agent's path), for --seconds. A viewer whose stream ends
early reconnects after the stream's retry delay with Last-Event-ID, as EventSource does.
With --leave drop the viewers drop their connections once they have the last event (tabs
closed); with --leave end the deployment's end event closes the streams.

With --decode each of the --rate lines/s is an SGLang `Decode batch` line stored as the
agent stores it: a log event and the metric the product's parser makes of it (two events).
--slow adds viewers that read nothing (a background tab on a slow link: a small receive
window) until the appends are over, then read on: they must be told that they fell behind
(a `behind` frame) and catch up from the record (or, past SKIP_LAG, be told where they
skipped to: a `skip` frame), and cost the others nothing.

Beside the figures: each client process's CPU (a share of a core) while the events were
appended and the machine's load average; where a client process used CLIENT_BOUND_SHARE
of a core or more (bench/_loadkit.py), the latency is not printed: the client, not the
panel, may have set it.

Prints: viewers connected, streams cut off, reconnects, keep-alives, delivery latency
p50/p99/max from the append call to receipt (the target is p99 <= 250 ms), lost events
(never received, by viewers that gave up too), duplicated and reordered ones (the target
is 0), and the panel's PostgreSQL sessions before, at peak, and after the viewers left
(--rounds repeats the viewers' visit: the count must not grow from round to round).
Beside them, measured in the same run: the live channel itself (a Redis reader in this
process, the same events appended to receipt: the floor under any delivery latency) and
the panel's memory (RSS of its process tree) before the viewers came, at peak, after.
--profile DIR records the panel's processes with py-spy (on PATH, or $PY_SPY): the run's
first 5 s into DIR/panel-first.txt, the rest into DIR/panel-rest.txt. The viewers' client
reads each response in its transport's callback (uvloop where installed) and undoes the
chunking itself: it must cost less than the panel.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import _loadkit as kit

RETRY_S = 2.0  # the stream's `retry:`, which EventSource waits before reconnecting
PROFILE_RATE = 50  # py-spy samples/s
PROFILE_FIRST_S = 5  # the profile's first part: the run's start
WINDOW_S = 5.0  # the latency's p99 is also shown by this much of the run


@dataclass
class Viewer:
    start_seq: int
    seqs: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    windows: dict[int, list[float]] = field(default_factory=dict)  # by WINDOW_S of the run
    keepalives: int = 0
    reconnects: int = 0
    broken: dict[str, int] = field(default_factory=dict)  # streams cut off, by cause
    failed: str = ""  # an error status, on which EventSource gives up
    connected: bool = False
    done: bool = False
    slow: bool = False  # reads nothing until the appends are over (a background tab)
    skips: list[tuple[int, int]] = field(default_factory=list)  # ranges it was told of
    behind: int = 0  # the times it was told it fell behind (then caught up from the record)
    raw: list[tuple[float, list[bytes]]] = field(default_factory=list)  # (receipt, ids)
    chunks: int = 0  # the reads that carried events
    sends: int = 0  # the chunks of the body: the panel's sends
    worst: tuple[float, float] = (0.0, 0.0)  # the longest latency and its event's send time


@dataclass
class Plan:
    url: str
    path: str
    cookie: str
    leave: str
    times: str  # the appender writes each timed seq's append time here (settle_figures)
    last_seq: int = 0  # the seq of the last bench event, once it is appended
    deadline: float = 0.0
    appended: asyncio.Event = field(default_factory=asyncio.Event)  # slow viewers read on


async def watch(plan: Plan, viewer: Viewer, ready: asyncio.Event) -> None:
    """Follow the stream like an EventSource until the last event (or the end)."""
    last = viewer.start_seq
    while not viewer.done and time.monotonic() < plan.deadline:
        try:
            last = await _stream(plan, viewer, last, ready)
        except (OSError, ValueError) as exc:
            cause = type(exc).__name__
            viewer.broken[cause] = viewer.broken.get(cause, 0) + 1
        if viewer.failed:
            return  # EventSource gives up on an error status too
        if not viewer.done:
            viewer.reconnects += 1
            await asyncio.sleep(RETRY_S)


async def _stream(plan: Plan, viewer: Viewer, last: int, ready: asyncio.Event) -> int:
    """One connection: the stream from `last` until the viewer is done or the stream ends."""
    loop = asyncio.get_running_loop()
    parsed = urlparse(plan.url)
    sock = socket.socket()
    if viewer.slow:
        # A background tab on a slow link: a small receive window, so the panel's writes to
        # it block soon after it stops reading.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (parsed.hostname or "127.0.0.1", parsed.port or 80))
    except OSError:
        sock.close()
        raise
    request = (f"GET {plan.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nCookie: {plan.cookie}"
               f"\r\nAccept: text/event-stream\r\nLast-Event-ID: {last}\r\n\r\n").encode()
    transport, reader = await loop.create_connection(
        lambda: StreamReading(plan, viewer, last, ready), sock=sock)
    try:
        transport.write(request)
        await reader.finished
    finally:
        transport.close()
    return reader.last


class StreamReading(asyncio.Protocol):
    """An SSE response read as it arrives: the chunked body undone and its whole frames
    read by regular expression, in the transport's callback (no task, no copy per line):
    200 viewers x 2,000 events/s read through asyncio's StreamReader cost this client
    more CPU than the panel spent serving them, on the same two cores."""

    def __init__(self, plan: Plan, viewer: Viewer, last: int, ready: asyncio.Event) -> None:
        self.plan, self.viewer, self.last, self.ready = plan, viewer, last, ready
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.head = b""  # the response's status and headers, until they are whole
        self.raw = b""  # body bytes not yet undone (a chunk's size line cut by a read)
        self.left = 0  # bytes of the current chunk still to come, its closing CRLF included
        self.text = b""  # undone body after the last whole frame
        self.scan = False  # whether a chunk of this text began as a keep-alive or skip may

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            if exc is None and not self.viewer.done:
                exc = ConnectionResetError("the server closed the connection mid-body")
            if exc is None:
                self.finished.set_result(None)
            else:
                self.finished.set_exception(exc)

    def data_received(self, data: bytes) -> None:
        received = time.time()
        if self.head is not None:
            data = self._headers(self.head + data)
            if not data:
                return
        body = self._unchunk(self.raw + data if self.raw else data)
        text = self.text + body if self.text else body
        end = text.rfind(b"\n\n")  # the panel sends whole frames: mostly all of it
        if end < 0:  # a read shorter than a frame: kept whole, to be read with the next
            self.text = text
        else:
            self.last = _frames(self.plan, self.viewer, text[:end + 2], received, self.last,
                                self.scan)
            self.text = text[end + 2:]
            self.scan = self.scan and bool(self.text)  # a flagged frame may be cut off
        if self.viewer.done or self.left < 0:
            self._finish()

    def _headers(self, data: bytes) -> bytes:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self.head = data
            return b""
        status = int(data.split(b" ", 2)[1])
        self.head = None  # type: ignore[assignment]
        if status != 200:
            self.viewer.failed = f"HTTP {status}"
            self._finish()
            return b""
        if not self.viewer.connected:
            self.viewer.connected = True
            self.ready.set()
        if self.viewer.slow and not self.plan.appended.is_set():
            assert self.transport is not None
            self.transport.pause_reading()
            task = asyncio.ensure_future(self.plan.appended.wait())
            task.add_done_callback(self._read_on)
        return data[end + 4:]

    def _read_on(self, _: object) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _unchunk(self, raw: bytes) -> bytes:
        """The chunked body's data in `raw`; what a read cut short waits in self.raw."""
        if self.left < 0:  # past the body's end
            return b""
        parts = []
        pos, n = 0, len(raw)
        while pos < n:
            if self.left == 0:  # at a chunk's size line
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(raw[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size == 0:  # the body's end
                    self.left = -1
                    pos = n
                    break
                self.left = size + 2
                self.viewer.sends += 1
                head = raw[pos:pos + SCAN_HEAD]
                # A keep-alive or a skip frame (each a chunk of its own), or a chunk's
                # start cut by the read: this text is searched for them.
                if (len(head) < SCAN_HEAD or head.startswith(KEEPALIVE)
                        or SKIP_KIND in head or BEHIND_KIND in head):
                    self.scan = True
            take = min(self.left, n - pos)
            data_end = pos + min(take, max(0, self.left - 2))  # not the chunk's CRLF
            if data_end > pos:
                parts.append(raw[pos:data_end])
            pos += take
            self.left -= take
        self.raw = raw[pos:] if pos < n else b""
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _finish(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.finished.done():
            self.finished.set_result(None)


ID = re.compile(rb"id: (\d+)\n")  # JSON has no raw newline: only an id line ends so
SENT = re.compile(rb'"bench_t":([0-9.e+-]+)')
SKIP = re.compile(rb'id: \d+\ndata: {[^\n]*"kind":"skip"[^\n]*"from":(\d+),"to":(\d+)[^\n]*\n\n')
SKIP_KIND = b'"kind":"skip"'
BEHIND_KIND = b'"kind":"behind"'  # the panel says the stream fell behind its ring
SCAN_HEAD = 64  # a frame's kind is in its first 64 bytes (`id: N\ndata: {"seq":N,"kind":`)
KEEPALIVE = b": keep-alive"


def _frames(plan: Plan, viewer: Viewer, text: bytes, received: float, last: int,
            scan: bool) -> int:
    """Whole frames, read by regular expression: 200 viewers x 2,000 events/s parsed as
    JSON would cost this client more than the panel. Keep-alives and skip frames are
    looked for only when a chunk began with one (`scan`, from _unchunk): the panel sends
    each as a chunk of its own, and a search of every read for them was a fifth of this
    client's CPU."""
    if scan:
        viewer.keepalives += text.count(KEEPALIVE)
        viewer.behind += text.count(BEHIND_KIND)
        if SKIP_KIND in text:  # the ranges told, and the skip frames' own ids left out
            for skip in SKIP.finditer(text):
                viewer.skips.append((int(skip[1]), int(skip[2])))
                last = max(last, int(skip[2]))
            text = SKIP.sub(b"", text)
    ids = ID.findall(text)
    if not ids:
        return last
    # Kept raw, turned into numbers after the run: the client's own work while the events
    # flow is one C call a read, so its lag is not what the figures measure. The send
    # times come from the appender (by seq), not from each frame: a second search of
    # every read was another fifth.
    viewer.raw.append((received, ids))
    # The last event (its metric after it) and the end come last in their send.
    tail = text[max(0, text.rfind(b"id: ", 0, text.rfind(b"id: "))):]
    if b'"kind":"end"' in tail or (plan.leave == "drop" and b'"last":true' in tail):
        viewer.done = True
    return max(last, int(ids[-1]))


def settle_figures(viewer: Viewer, times: dict[int, float]) -> None:
    """The raw ids of a viewer's reads as seqs, and the timed ones' latencies: receipt
    minus the time just before the append call that stored them (what `bench_t` in the
    event says)."""
    viewer.chunks += len(viewer.raw)
    start = min(times.values(), default=0.0)
    for received, ids in viewer.raw:
        seqs = list(map(int, ids))
        viewer.seqs.extend(seqs)
        sent = [times[s] for s in seqs if s in times]
        viewer.latencies.extend(received - t for t in sent)
        for t in sent:
            viewer.windows.setdefault(int((t - start) / WINDOW_S), []).append(received - t)
        if sent:
            viewer.worst = max(viewer.worst, (received - sent[0], sent[0]),
                               (received - sent[-1], sent[-1]))
    viewer.raw.clear()


def read_times(path: str) -> dict[int, float]:
    """The appender's file: a line per append call, its time then its timed seqs."""
    times: dict[int, float] = {}
    with open(path) as lines:
        for line in lines:
            t, *seqs = line.split()
            times.update((int(s), float(t)) for s in seqs)
    return times


# ------------------------------------------------------------------ appender


DECODE_LINE = ("[{t}] Decode batch, #running-req: 32, #token: {n}, token usage: 0.41, "
               "accept len: 5.12, accept rate: 0.62, cuda graph: True, "
               "gen throughput (token/s): 2841.07, #queue-req: 0")


def append_events(pk: int, rate: float, batch: int, count: int, decode: bool,
                  times_path: str) -> None:
    """Append `count` lines at `rate`/s, `batch` per call; the last one says so. Each
    call's time and the seqs of its timed events (its log lines) go to times_path."""
    from django.db import connection

    from appliance.logs.parser import LogParser
    from web.deployments import services

    interval = batch / rate
    parser = LogParser()
    started = time.monotonic()
    sent = 0
    timed: list[str] = []
    while sent < count:
        time.sleep(max(0.0, started + (sent / batch) * interval - time.monotonic()))
        size = min(batch, count - sent)
        now = time.time()
        events: list[tuple[str, dict[str, object]]] = []
        for i in range(sent, sent + size):
            events.extend(_line_events(parser, i, now, last=i == count - 1, decode=decode))
        stored = services.events_append(deployment_id=pk, events=events)
        timed.append(" ".join([repr(now), *(str(e.seq) for e in stored
                                            if "bench_t" in e.payload)]))
        sent += size
    connection.close()
    Path(times_path).write_text("\n".join(timed) + "\n")
    # The agent's process lives on; this one stays while its publisher thread sends the last
    # batch to the live channel (else the viewers get it from the record, a keep-alive later).
    time.sleep(2)


def _line_events(parser: object, i: int, now: float, *, last: bool,
                 decode: bool) -> list[tuple[str, dict[str, object]]]:
    """A plain line (one event), or a decode line as the agent stores it: the log event,
    then the metric the product's parser makes of it."""
    if not decode:
        return [("log", {"text": f"bench line {i}", "bench_t": now, "last": last})]
    text = DECODE_LINE.format(t=time.strftime("%Y-%m-%d %H:%M:%S"), n=1000 + i % 5000)
    parsed = parser.feed(text)  # type: ignore[attr-defined]
    return [("log", {"stream": "stdout", "text": text, "bench_t": now, "last": last}),
            *(("metric", e.to_dict()) for e in parsed)]


def run_appender(args: argparse.Namespace, pk: int, count: int,
                 times_path: str) -> subprocess.Popen[bytes]:
    """In its own process, so that the viewers' parsing does not slow the appends."""
    return subprocess.Popen([
        sys.executable, __file__, "--database-url", args.database_url,
        "--redis-url", args.redis_url, "--append-to", str(pk), "--rate", str(args.rate),
        "--batch", str(args.batch), "--count", str(count), "--times", times_path,
        *(["--decode"] * args.decode)])


def last_bench_seq(pk: int) -> int:
    from web.deployments.models import Event

    event = Event.objects.filter(deployment_id=pk, payload__last=True).only("seq").first()
    return event.seq if event else 0


# ---------------------------------------------------------------------- main


@dataclass
class Round:
    viewers: list[Viewer]
    last_seq: int
    peak: dict[str, int]
    after: dict[str, int]
    appender_rc: int
    reference: Reference
    processes: int = 1


async def scenario(args: argparse.Namespace, plan: Plan, pk: int, pg: kit.PgConnections,
                   clients: Clients) -> tuple[list[Viewer], dict[str, int], int, Reference]:
    from asgiref.sync import sync_to_async

    reference = Reference(rss_before=clients.rss_before)
    connected = await asyncio.to_thread(clients.connected)
    print(f"connected {connected}/{clients.total}; quiet {args.quiet:g} s", flush=True)
    peak = await asyncio.to_thread(pg.count)
    reference.rss_connected = panel_rss()
    await asyncio.sleep(args.quiet)
    count = max(1, int(args.rate * args.seconds))
    channel = asyncio.create_task(read_channel(args, pk, clients.start, plan, reference))
    profiler = start_profiler(args)
    client_pids = [p.pid for p in clients.procs if p.pid]
    cpu0 = kit.cpu_seconds(panel_pids()), kit.cpu_seconds(client_pids), time.monotonic()
    each0 = [kit.cpu_seconds([pid]) for pid in client_pids]
    appender = run_appender(args, pk, count, plan.times)
    while appender.poll() is None:
        if profiler is not None:
            profiler.poll()
        peak = max(peak, await asyncio.to_thread(pg.count), key=lambda c: c["total"])
        reference.rss_peak = max(reference.rss_peak, panel_rss())
        await asyncio.sleep(0.25)
    reference.appending = (kit.cpu_seconds(panel_pids()) - cpu0[0],
                           kit.cpu_seconds(client_pids) - cpu0[1], time.monotonic() - cpu0[2])
    reference.client_procs_cpu = [kit.cpu_seconds([pid]) - was
                                  for pid, was in zip(client_pids, each0, strict=True)]
    reference.load = kit.load_average()
    plan.last_seq = await sync_to_async(last_bench_seq)(pk)
    clients.appended.set()
    if args.leave == "end":
        await sync_to_async(append_end)(pk)
    results = asyncio.create_task(asyncio.to_thread(clients.results, plan.deadline))
    while not results.done():
        if profiler is not None:
            profiler.poll()
        reference.rss_peak = max(reference.rss_peak, panel_rss())
        reference.panel_cpu = kit.cpu_seconds(panel_pids()) - cpu0[0]
        # The clients exit once done: their last reading stands.
        reference.client_cpu = max(reference.client_cpu, kit.cpu_seconds(client_pids) - cpu0[1])
        reference.wall = time.monotonic() - cpu0[2]
        await asyncio.wait([results], timeout=0.25)
    stop_profiler(profiler, args)
    reference.client_gc = clients.gc
    channel.cancel()
    return results.result(), peak, appender.returncode, reference


class Clients:
    """The viewers, spread over --clients processes (forked before any event loop), so
    that the client's own parsing is not what the figures measure."""

    def __init__(self, plan: Plan, viewers: list[Viewer], n: int) -> None:
        import multiprocessing

        from django.db import connection

        connection.close()  # the children use no database
        ctx = multiprocessing.get_context("fork")
        self.total = len(viewers)
        self.start = viewers[0].start_seq if viewers else 0
        self.rss_before = panel_rss()
        self.appended = ctx.Event()
        self.gc = (0, 0.0, 0.0)  # the clients' collector: passes, the longest, all (s)
        self.out: Any = ctx.Queue()
        self.procs = [ctx.Process(target=client_main, daemon=True,
                                  args=(plan, viewers[i::n], self.appended, self.out))
                      for i in range(n)]
        for proc in self.procs:
            proc.start()

    def connected(self) -> int:
        return sum(self._get("connected", 90) for _ in self.procs)

    def results(self, deadline: float) -> list[Viewer]:
        viewers: list[Viewer] = []
        for _ in self.procs:
            got, (passes, longest, total) = self._get(
                "done", max(5.0, deadline - time.monotonic() + 60))
            viewers.extend(got)
            self.gc = (self.gc[0] + passes, max(self.gc[1], longest), self.gc[2] + total)
        for proc in self.procs:
            proc.join(timeout=10)
        return viewers

    def _get(self, kind: str, timeout: float) -> Any:
        got, value = self.out.get(timeout=timeout)
        assert got == kind, (got, kind)
        return value


class GcPauses:
    """The garbage collector's passes in a client process: a pass stops every viewer of
    the process at once, and shows as delivery latency that is none of the panel's."""

    def __init__(self) -> None:
        self.started = 0.0
        self.longest = self.total = 0.0
        self.passes = 0
        gc.callbacks.append(self.record)

    def record(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        self.passes += 1
        self.total += took
        self.longest = max(self.longest, took)


def client_main(plan: Plan, viewers: list[Viewer], appended: Any, out: Any) -> None:
    # Off while the viewers read: the raw ids they keep are millions of small objects, and
    # the collector's passes over them (up to 202 ms each, 1.2 s in a run) stopped all the
    # viewers of the process at once; what they keep holds no reference cycle.
    gc.disable()
    pauses = GcPauses()
    try:  # the lighter loop, where it is installed: the client is not what is measured
        import uvloop
    except ImportError:
        asyncio.run(_client(plan, viewers, appended, out))
    else:
        uvloop.run(_client(plan, viewers, appended, out))
    times = read_times(plan.times) if Path(plan.times).exists() else {}
    gc.callbacks.remove(pauses.record)
    gc.enable()
    for viewer in viewers:
        settle_figures(viewer, times)
    out.put(("done", (viewers, (pauses.passes, pauses.longest, pauses.total))))


async def _client(plan: Plan, viewers: list[Viewer], appended: Any, out: Any) -> None:
    ready = [asyncio.Event() for _ in viewers]
    tasks = [asyncio.create_task(watch(plan, v, r)) for v, r in zip(viewers, ready, strict=True)]
    await asyncio.wait([asyncio.create_task(r.wait()) for r in ready], timeout=60)
    out.put(("connected", sum(v.connected for v in viewers)))
    await asyncio.to_thread(appended.wait, max(1.0, plan.deadline - time.monotonic()))
    plan.appended.set()
    await asyncio.wait(tasks, timeout=max(1.0, plan.deadline - time.monotonic()))
    for task in tasks:
        task.cancel()


@dataclass
class Reference:
    """What the same run measures beside the viewers."""
    rss_before: int = 0  # the panel's memory (kB) before the viewers came
    rss_connected: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    channel: list[float] = field(default_factory=list)  # append -> a direct Redis read
    panel_cpu: float = 0.0  # CPU seconds the panel and the clients spent from the first
    client_cpu: float = 0.0  # append until the viewers were done
    wall: float = 0.0
    client_gc: tuple[int, float, float] = (0, 0.0, 0.0)  # the clients' GC passes, longest, all
    client_procs_cpu: list[float] = field(default_factory=list)  # each client process's
    load: str = ""  # the machine's load average when the appends ended
    appending: tuple[float, float, float] = (0.0, 0.0, 0.0)  # the same, until the appender
    # exits (2 s after its last append): the clients' figures, read after, left out


async def read_channel(args: argparse.Namespace, pk: int, start: int, plan: Plan,
                       reference: Reference) -> None:
    """The live channel itself: the deployment's Redis stream read by this process."""
    import redis.asyncio as aioredis

    from web.deployments import live

    client = aioredis.Redis.from_url(args.redis_url)
    last = f"0-{start}"
    try:
        while time.monotonic() < plan.deadline:
            reply: Any = await client.xread({live.stream_key(pk): last}, block=1000, count=5000)
            received = time.time()
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    sent = SENT.search(fields.get(b"data", b""))
                    if sent:
                        reference.channel.append(received - float(sent[1]))
                    if b'"last":true' in fields.get(b"data", b""):
                        return
    finally:
        await client.aclose()


def panel_pids() -> list[int]:
    """The uvicorn this bench started, and its worker processes."""
    found: list[int] = []
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:  # a thread or process may end while it is read
                children = [int(c) for c in task.read_text().split()]
                mine = [c for c in children if pid != os.getpid()
                        or b"uvicorn" in Path(f"/proc/{c}/cmdline").read_bytes()]
            except OSError:
                continue
            todo.extend(mine)
            found.extend(mine)
    return found


def panel_rss() -> int:
    total = 0
    for pid in panel_pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmRSS:")), 0)
    return total


class Profiler:
    """py-spy on the panel's processes in two parts: the run's first PROFILE_FIRST_S (the
    fan-outs that reach 1,200 streams whose sockets are not yet full) and the rest."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.py_spy = os.environ.get("PY_SPY") or shutil.which("py-spy") or "py-spy"
        self.dir: Path = args.profile
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pid = next(p for p in panel_pids()
                        if b"uvicorn" in Path(f"/proc/{p}/cmdline").read_bytes())
        self.parts = [("first", self.dir / "panel-first.txt"),
                      ("rest", self.dir / "panel-rest.txt")]
        self.first = self._record(self.parts[0][1], PROFILE_FIRST_S)
        self.rest: subprocess.Popen[bytes] | None = None

    def _record(self, path: Path, seconds: float | None = None) -> subprocess.Popen[bytes]:
        with path.with_suffix(".log").open("wb") as log:
            return subprocess.Popen(
                [self.py_spy, "record", "--pid", str(self.pid), "--subprocesses", "--rate",
                 str(PROFILE_RATE), "--format", "raw", "--output", str(path),
                 *(["--duration", str(int(seconds))] if seconds else [])],
                stdout=log, stderr=subprocess.STDOUT)

    def poll(self) -> None:
        """The second part starts once the first is written."""
        if self.rest is None and self.first.poll() is not None:
            self.rest = self._record(self.parts[1][1])

    def stop(self) -> None:
        import signal

        self.first.wait(timeout=60)
        self.poll()
        assert self.rest is not None
        self.rest.send_signal(signal.SIGINT)
        self.rest.wait(timeout=60)
        for name, path in self.parts:
            print(f"profile ({name} {PROFILE_FIRST_S:g} s of the run)" if name == "first"
                  else f"profile (the {name})", f"{path}:")
            if not path.exists():  # py-spy says why in its log
                print(f"  none written; {path.with_suffix('.log')}")
                continue
            (seconds, _), *top = profile_top(path)
            print(f"  {seconds:.1f} seconds of busy samples in all; of them:")
            for share, func in top:
                print(f"  {share:5.1f} %  {func}")


def start_profiler(args: argparse.Namespace) -> Profiler | None:
    return Profiler(args) if args.profile else None


def stop_profiler(profiler: Profiler | None, args: argparse.Namespace) -> None:
    if profiler is not None:
        profiler.stop()


IDLE = ("_worker (concurrent/futures/thread.py", "wait (threading.py", ".select (selectors.py",
        "_recv (multiprocessing/connection.py")  # the last: uvicorn's supervisor pipe


def profile_top(path: Path, n: int = 12) -> list[tuple[float, str]]:
    """The functions of the panel's own code (and the server's) by share of its busy
    samples (idle threads and the event loop's wait left out) they are on the stack of."""
    inclusive: dict[str, int] = {}
    busy = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if any(idle in stack.rsplit(";", 1)[-1] for idle in IDLE):
            continue
        samples = int(count)
        busy += samples
        for name in {f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].split("/")[-1]
                     + ")" for f in stack.split(";") if " (" in f}:
            inclusive[name] = inclusive.get(name, 0) + samples
    mine = [(100 * c / max(1, busy), name) for name, c in inclusive.items()
            if any(k in name for k in ("sse.py", "feed.py", "streams.py", "frames.py", "live.py",
                                       "selectors.py", "h11", "httptools", "asgi.py", "json",
                                       "write"))]
    return [(float(busy / PROFILE_RATE), "seconds of busy samples in all"),
            *sorted(mine, reverse=True)[:n]]


def current_seq(pk: int) -> int:
    from web.deployments.models import Deployment

    return Deployment.objects.values_list("last_seq", flat=True).get(pk=pk)


def append_end(pk: int) -> None:
    from web.deployments import services

    services.events_append(deployment_id=pk, events=[("end", {"status": "stopped"})])


def drop_live_stream(pk: int) -> None:
    """The bench deployment's Redis stream, which nothing reads any more."""
    import redis
    from django.conf import settings

    from web.deployments import live

    redis.Redis.from_url(settings.REDIS_URL).delete(live.stream_key(pk))


def one_round(args: argparse.Namespace, url: str, cookie: str, pg: kit.PgConnections,
              baseline: int) -> Round:
    """Viewers of a fresh deployment come, watch, and leave; then the sessions settle."""
    pk = kit.bench_deployment("bench-sse").pk
    plan = Plan(url=url, path=f"/deployments/{pk}/events/stream/", cookie=cookie,
                leave=args.leave, times=tempfile.mktemp(prefix="load-sse-times-"))
    plan.deadline = time.monotonic() + args.quiet + args.seconds + 120
    start = current_seq(pk)
    viewers = [Viewer(start_seq=start) for _ in range(args.viewers)]
    viewers += [Viewer(start_seq=start, slow=True) for _ in range(args.slow)]
    clients = Clients(plan, viewers, args.clients)
    processes = panel_processes()
    viewers, peak, appender_rc, reference = asyncio.run(scenario(args, plan, pk, pg, clients))
    after = kit.settle(pg, baseline, args.settle)
    reference.rss_after = panel_rss()
    drop_live_stream(pk)
    return Round(viewers, plan.last_seq, peak, after, appender_rc, reference, processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kit.add_common_args(parser)
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50, help="events/s")
    parser.add_argument("--batch", type=int, default=1, help="events per append call")
    parser.add_argument("--seconds", type=float, default=20, help="how long to append")
    parser.add_argument("--quiet", type=float, default=0,
                        help="seconds the connected viewers wait before the first event")
    parser.add_argument("--leave", choices=["drop", "end"], default="drop")
    parser.add_argument("--rounds", type=int, default=1,
                        help="viewers come and leave this many times (sessions must not grow)")
    parser.add_argument("--settle", type=float, default=15, help="seconds to wait for the "
                        "sessions to come back to the count before the viewers came")
    parser.add_argument("--decode", action="store_true", help="each line an SGLang decode "
                        "line: a log event and a metric event, as the agent stores it")
    parser.add_argument("--slow", type=int, default=0, help="viewers more that read nothing "
                        "until the appends are over (background tabs)")
    parser.add_argument("--profile", type=Path, help="record the panel with py-spy here")
    parser.add_argument("--clients", type=int, default=2, help="processes the viewers are "
                        "spread over (the client's parsing must not be the limit)")
    parser.add_argument("--append-to", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--times", help=argparse.SUPPRESS)
    args = parser.parse_args()
    kit.setup_django(args)
    if args.append_to:
        append_events(args.append_to, args.rate, args.batch, args.count, args.decode,
                      args.times)
        return
    kit.bench_user()
    LOAD_BEFORE.append(kit.load_average())
    log_path = Path(tempfile.mkdtemp(prefix="load-sse-")) / "panel.log"
    pg = kit.PgConnections(args)
    with served_panel(args, log_path) as url:
        cookie = kit.login_cookie(url)
        before = pg.count()
        rounds = [one_round(args, url, cookie, pg, before["total"]) for _ in range(args.rounds)]
    if any(r.appender_rc != 0 for r in rounds):
        print("the appender failed: figures are incomplete")
    report(args, rounds, before, log_path)
    pg.close()


ENTRYPOINT = kit.ROOT / "docker" / "panel" / "entrypoint.sh"


@contextmanager
def served_panel(args: argparse.Namespace, log_path: Path) -> Iterator[str]:
    """The panel as its image serves it: `entrypoint.sh serve` (uvicorn, one process per
    core up to 4, each with its own live feed), on a free port of the loopback."""
    if args.url:
        yield args.url.rstrip("/")
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = dict(os.environ)
    env.pop("APPLIANCE_DEBUG", None)
    env.update(
        APPLIANCE_DATABASE_URL=args.database_url, APPLIANCE_REDIS_URL=args.redis_url,
        APPLIANCE_SECRET_KEY=secrets.token_urlsafe(48), DJANGO_SETTINGS_MODULE="web.settings",
        PYTHONUNBUFFERED="1", PGAPPNAME=kit.PANEL_APP_NAME,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        # Its own: entrypoint.sh empties the directory at each start.
        PROMETHEUS_MULTIPROC_DIR=tempfile.mkdtemp(prefix="load-sse-prom-"))
    env.update(item.split("=", 1) for item in args.server_env)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["sh", str(ENTRYPOINT), "serve", "web.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning"],
            cwd=args.app_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            kit.wait_healthy(url, proc, log_path, timeout_s=60)
            yield url
        finally:
            proc.terminate()  # uvicorn's supervisor stops its workers
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def panel_processes() -> int:
    """uvicorn's serving processes: its workers (multiprocessing's spawned children), or
    itself when it has none."""
    workers = 0
    for pid in panel_pids():
        try:
            workers += b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
    return workers or 1


def sse_setting(name: str) -> int:
    """A setting of the event streams (sse.py), their feed (feed.py) or their places
    (streams.py)."""
    from web.deployments import feed, sse, streams

    module = next(m for m in (sse, feed, streams) if hasattr(m, name))
    return int(getattr(module, name))


def stalled_ceiling() -> int:
    """What the panel's process holds for a stream whose client stopped reading, at most:
    its send (SEND_BYTES), and in the transport's buffer its high water (uvloop's and
    asyncio's 64 KiB) plus the write that passed it (a send's framed copy)."""
    return 2 * sse_setting("SEND_BYTES") + 2**16


LOST_SHOWN: list[str] = []
LOAD_BEFORE: list[str] = []  # the machine's load average when the run started
SLOWED = 3  # appends that took this many times their offered time: the machine's figure


def tally(rounds: list[Round], slow: bool) -> dict[str, int]:
    """Lost: neither received nor inside a range the viewer was told it skipped."""
    lost = duplicated = reordered = skipped = 0
    for r in rounds:
        for v in (v for v in r.viewers if v.slow == slow):
            seen = set(v.seqs)
            told = {s for first, end in v.skips for s in range(first, end + 1)}
            wanted = range(v.start_seq + 1, r.last_seq + 1)
            missing = [s for s in wanted if s not in seen and s not in told]
            lost += len(missing)
            if missing and len(LOST_SHOWN) < 5:  # where, to look into it
                LOST_SHOWN.append(f"  a viewer from seq {v.start_seq} lost {missing[:10]} "
                                  f"of 1..{r.last_seq}; it got {len(v.seqs)}, reconnected "
                                  f"{v.reconnects} times, broken {v.broken or 0}")
            skipped += sum(1 for s in wanted if s in told)
            duplicated += len(v.seqs) - len(seen)
            reordered += sum(1 for a, b in zip(v.seqs, v.seqs[1:], strict=False) if b < a)
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered,
            "skipped (told)": skipped}


def report(args: argparse.Namespace, rounds: list[Round], before: dict[str, int],
           log_path: Path) -> None:
    everyone = [v for r in rounds for v in r.viewers]
    chunks = sum(v.chunks for v in everyone if not v.slow)
    sends = sum(v.sends for v in everyone if not v.slow)
    viewers = [v for v in everyone if not v.slow]
    slow = [v for v in everyone if v.slow]
    latencies = [x for v in viewers for x in v.latencies]
    channel = [x for r in rounds for x in r.reference.channel]
    failed: dict[str, int] = {}
    broken: dict[str, int] = {}
    for v in everyone:
        if v.failed:
            failed[v.failed] = failed.get(v.failed, 0) + 1
        for cause, n in v.broken.items():
            broken[cause] = broken.get(cause, 0) + n
    kind = "decode lines (2 events each)" if args.decode else "events"
    print(f"command: {kit.command_line()}")
    print(f"viewers {args.viewers} (+{args.slow} slow) x {len(rounds)} round(s), {args.rate:g} "
          f"{kind}/s in calls of {args.batch}, {args.seconds:g} s, quiet {args.quiet:g} s, "
          f"leave {args.leave}, panel {args.url or args.app_dir}")
    print(f"panel               sh docker/panel/entrypoint.sh serve: {rounds[0].processes} "
          f"serving process(es) on {os.cpu_count()} cores")
    print(f"connected           {sum(v.connected for v in everyone)}/{len(everyone)}")
    print(f"got every event     {sum(v.done for v in viewers)}/{len(viewers)}")
    print(f"gave up on          {failed or 0}")
    print(f"streams cut off     {broken or 0}")
    print(f"reconnects          {sum(v.reconnects for v in everyone)}")
    print(f"keep-alives seen    {sum(v.keepalives for v in everyone)}")
    print(f"events delivered    {len(latencies)} timed (live channel itself: {len(channel)}), "
          f"in {sends} sends of the panel ({len(latencies) / max(1, sends):.1f} timed events "
          f"a send), {chunks} reads of the viewers")
    shares = [kit.client_verdict(r.reference.client_procs_cpu, r.reference.appending[2])
              for r in rounds]
    print(f"load average        before {LOAD_BEFORE[0] if LOAD_BEFORE else '?'}; as the appends "
          "ended " + ", ".join(r.reference.load for r in rounds) + f" ({os.cpu_count()} cores)")
    print("client processes    " + ", ".join(text for text, _ in shares)
          + f" while appending (a figure is withheld where one used "
          f"{kit.CLIENT_BOUND_SHARE:.0%} of a core or more)")
    took = max(r.reference.appending[2] for r in rounds)
    print(f"appends took        {took:.1f} s for {args.seconds:g} s offered (the appender "
          "exits 2 s after its last append)")
    if any(bound for _, bound in shares):
        print("latency             withheld: a client process was near a full core, so the "
              "client may have set it; run with more --clients (or on more cores)")
    elif took > SLOWED * (args.seconds + 2) + args.quiet:
        print(f"latency             withheld: the appends took over {SLOWED}x their time, so "
              "the machine did not run the offered rate; the figures measure its scheduler")
    else:
        for label, p in (("p50", 50), ("p99", 99)):
            print(f"latency {label}         {kit.ms(kit.percentile(latencies, p))}   "
                  f"(live channel read directly, same run: "
                  f"{kit.ms(kit.percentile(channel, p))})")
    worst, sent = max((v.worst for v in viewers), default=(float("nan"), 0.0))
    first = min((v.worst[1] for v in viewers if v.worst[1]), default=sent)
    print(f"latency max         {kit.ms(worst)} (an event appended {sent - first:.1f} s "
          "into the run)")
    windows: dict[int, list[float]] = {}
    for v in viewers:
        for w, values in v.windows.items():
            windows.setdefault(w, []).extend(values)
    print(f"p99 by {WINDOW_S:g} s       " + ", ".join(
        f"{w * WINDOW_S:g}-{(w + 1) * WINDOW_S:g} s: {kit.percentile(windows[w], 99) * 1000:.0f}"
        for w in sorted(windows)) + " ms (by when the event was appended)")
    for name, n in tally(rounds, slow=False).items():
        print(f"{name:<20}{n}")
    print(f"told behind         {sum(1 for v in viewers if v.behind)}/{len(viewers)} viewers "
          f"({sum(v.behind for v in viewers)} times; each then caught up from the record)")
    for line in LOST_SHOWN:
        print(line)
    if slow:
        told = sum(1 for v in slow if v.skips)
        print(f"slow viewers: told behind {sum(1 for v in slow if v.behind)}/{len(slow)}, "
              f"told of a skip {told}/{len(slow)}, then reached the last event "
              f"{sum(v.done for v in slow)}/{len(slow)}; "
              + ", ".join(f"{k} {n}" for k, n in tally(rounds, slow=True).items()))
    for i, r in enumerate(rounds, 1):
        ref = r.reference
        panel_cpu, client_cpu, wall = ref.appending
        delivered = sum(len(v.seqs) for v in r.viewers)
        print(f"CPU while appending round {i}: panel {panel_cpu:.1f} s "
              f"({1e6 * panel_cpu / max(1, delivered):.2f} us a delivered event), the viewers' "
              f"clients {client_cpu:.1f} s, over {wall:.1f} s")
        passes, longest, total = ref.client_gc
        print(f"clients' GC         round {i}: {passes} passes, the longest "
              f"{longest * 1000:.0f} ms, {total:.1f} s in all (each stops its process's "
              "viewers; off while they read)")
        print(f"CPU seconds         round {i}: panel {ref.panel_cpu:.1f}, the viewers' clients "
              f"{ref.client_cpu:.1f}, over {ref.wall:.1f} s from the first append to the last "
              "viewer done")
        print(f"panel memory (RSS)  round {i}: before {ref.rss_before / 1024:.0f} MB, "
              f"viewers connected {ref.rss_connected / 1024:.0f} MB, peak "
              f"{ref.rss_peak / 1024:.0f} MB, after {ref.rss_after / 1024:.0f} MB")
        if args.slow:
            print(f"  peak over connected, a slow viewer: "
                  f"{(ref.rss_peak - ref.rss_connected) / args.slow:.0f} kB (the panel's "
                  f"ceiling for a stalled stream: {stalled_ceiling() // 1024} kB, and "
                  f"{sse_setting('STREAM_UNSENT_BYTES') // 1024} kB unsent in the kernel; "
                  f"on top, each process's feed: its ring, at most "
                  f"{sse_setting('RING_BYTES') // 2**20} MiB, and up to "
                  f"{sse_setting('CATCHUP_PAGES')} pages of {sse_setting('REPLAY_PAGE')} "
                  "events)")
    print(f"panel's pg sessions before   {kit.show_counts(before)}")
    for i, r in enumerate(rounds, 1):
        print(f"  round {i}: peak {kit.show_counts(r.peak)}; after {kit.show_counts(r.after)}")
    print(f"uptime: {Path('/proc/loadavg').read_text().strip()}")
    print(f"panel log: {log_path}")


if __name__ == "__main__":
    main()
