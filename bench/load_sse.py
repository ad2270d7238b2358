"""Many SSE viewers of one deployment while its events are appended, against a
production-like panel.

    python bench/load_sse.py --database-url postgres://USER@HOST:PORT/DB \\
        --redis-url redis://HOST:PORT/N [--viewers 200] [--rate 50] [--batch 1] \\
        [--seconds 20] [--quiet 0] [--leave drop|end] [--rounds 1]

The viewers log in once (a session cookie) and open the event stream of a fresh
deployment from its current end (Last-Event-ID), as browsers do. They may first be held
--quiet seconds without events (the keep-alive path); then another process appends
--rate events/s in calls of --batch events through services.events_append (the agent's
path), for --seconds. A viewer whose stream ends early reconnects after the stream's
retry delay with Last-Event-ID, as EventSource does. With --leave drop the viewers drop
their connections once they have the last event (tabs closed); with --leave end the
deployment's end event closes the streams.

Prints: viewers connected, streams cut off, reconnects, keep-alives, delivery latency
p50/p99/max from the append call to receipt (the target is p99 <= 250 ms), lost events
(never received, by viewers that gave up too), duplicated and reordered ones (the target
is 0), and the panel's PostgreSQL sessions before, at peak, and after the viewers left
(--rounds repeats the viewers' visit: the count must not grow from round to round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _loadkit as kit

RETRY_S = 2.0  # the stream's `retry:`, which EventSource waits before reconnecting


@dataclass
class Viewer:
    start_seq: int
    seqs: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    keepalives: int = 0
    reconnects: int = 0
    broken: dict[str, int] = field(default_factory=dict)  # streams cut off, by cause
    failed: str = ""  # an error status, on which EventSource gives up
    connected: bool = False
    done: bool = False


@dataclass
class Plan:
    url: str
    path: str
    cookie: str
    leave: str
    last_seq: int = 0  # the seq of the last bench event, once it is appended
    deadline: float = 0.0


async def watch(plan: Plan, viewer: Viewer, ready: asyncio.Event) -> None:
    """Follow the stream like an EventSource until the last event (or the end)."""
    last = viewer.start_seq
    while not viewer.done and time.monotonic() < plan.deadline:
        http = kit.Http(plan.url)
        try:
            last = await _stream(plan, viewer, http, last, ready)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            cause = type(exc).__name__
            viewer.broken[cause] = viewer.broken.get(cause, 0) + 1
        finally:
            http.close()
        if viewer.failed:
            return  # EventSource gives up on an error status too
        if not viewer.done:
            viewer.reconnects += 1
            await asyncio.sleep(RETRY_S)


async def _stream(plan: Plan, viewer: Viewer, http: kit.Http, last: int,
                  ready: asyncio.Event) -> int:
    headers = {"Cookie": plan.cookie, "Accept": "text/event-stream", "Last-Event-ID": str(last)}
    status, _ = await http.get(plan.path, headers)
    if status != 200:
        viewer.failed = f"HTTP {status}"
        return last
    if not viewer.connected:
        viewer.connected = True
        ready.set()
    buffer = b""
    async for chunk in http.chunks():
        received = time.time()
        buffer += chunk
        *frames, buffer = buffer.split(b"\n\n")
        for frame in frames:
            last = _frame(plan, viewer, frame, received, last)
            if viewer.done:
                return last
    return last


def _frame(plan: Plan, viewer: Viewer, frame: bytes, received: float, last: int) -> int:
    if frame.startswith(b":"):
        viewer.keepalives += 1
        return last
    data = next((line[6:] for line in frame.split(b"\n") if line.startswith(b"data: ")), None)
    if data is None:
        return last
    event = json.loads(data)
    viewer.seqs.append(event["seq"])
    sent = event["payload"].get("bench_t")
    if sent is not None:
        viewer.latencies.append(received - sent)
    if event["kind"] == "end" or (plan.leave == "drop" and event["payload"].get("last")):
        viewer.done = True
    return int(event["seq"])


# ------------------------------------------------------------------ appender


def append_events(pk: int, rate: float, batch: int, count: int) -> None:
    """Append `count` events at `rate`/s, `batch` per call; the last one says so."""
    from django.db import connection

    from web.deployments import services

    interval = batch / rate
    started = time.monotonic()
    sent = 0
    while sent < count:
        time.sleep(max(0.0, started + (sent / batch) * interval - time.monotonic()))
        size = min(batch, count - sent)
        now = time.time()
        events = [("log", {"text": f"bench line {sent + i}", "bench_t": now,
                           "last": sent + i == count - 1}) for i in range(size)]
        services.events_append(deployment_id=pk, events=events)
        sent += size
    connection.close()


def run_appender(args: argparse.Namespace, pk: int, count: int) -> subprocess.Popen[bytes]:
    """In its own process, so that the viewers' parsing does not slow the appends."""
    return subprocess.Popen([
        sys.executable, __file__, "--database-url", args.database_url,
        "--redis-url", args.redis_url, "--append-to", str(pk), "--rate", str(args.rate),
        "--batch", str(args.batch), "--count", str(count)])


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


async def scenario(args: argparse.Namespace, plan: Plan, pk: int,
                   pg: kit.PgConnections) -> tuple[list[Viewer], dict[str, int], int]:
    from asgiref.sync import sync_to_async

    start = await sync_to_async(current_seq)(pk)
    viewers = [Viewer(start_seq=start) for _ in range(args.viewers)]
    plan.deadline = time.monotonic() + args.quiet + args.seconds + 120
    ready = [asyncio.Event() for _ in viewers]
    tasks = [asyncio.create_task(watch(plan, v, r)) for v, r in zip(viewers, ready, strict=True)]
    await asyncio.wait([asyncio.create_task(r.wait()) for r in ready], timeout=60)
    connected = sum(v.connected for v in viewers)
    print(f"connected {connected}/{len(viewers)}; quiet {args.quiet:g} s", flush=True)
    peak = await asyncio.to_thread(pg.count)
    await asyncio.sleep(args.quiet)
    count = max(1, int(args.rate * args.seconds))
    appender = run_appender(args, pk, count)
    while appender.poll() is None:
        peak = max(peak, await asyncio.to_thread(pg.count), key=lambda c: c["total"])
        await asyncio.sleep(0.25)
    plan.last_seq = await sync_to_async(last_bench_seq)(pk)
    if args.leave == "end":
        await sync_to_async(append_end)(pk)
    await asyncio.wait(tasks, timeout=max(1.0, plan.deadline - time.monotonic()))
    for task in tasks:
        task.cancel()
    return viewers, peak, appender.returncode


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
                leave=args.leave)
    viewers, peak, appender_rc = asyncio.run(scenario(args, plan, pk, pg))
    after = kit.settle(pg, baseline, args.settle)
    drop_live_stream(pk)
    return Round(viewers, plan.last_seq, peak, after, appender_rc)


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
    parser.add_argument("--append-to", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    kit.setup_django(args)
    if args.append_to:
        append_events(args.append_to, args.rate, args.batch, args.count)
        return
    kit.bench_user()
    log_path = Path(tempfile.mkdtemp(prefix="load-sse-")) / "panel.log"
    pg = kit.PgConnections(args)
    with kit.panel(args, log_path) as url:
        cookie = kit.login_cookie(url)
        before = pg.count()
        rounds = [one_round(args, url, cookie, pg, before["total"]) for _ in range(args.rounds)]
    if any(r.appender_rc != 0 for r in rounds):
        print("the appender failed: figures are incomplete")
    report(args, rounds, before, log_path)
    pg.close()


def tally(rounds: list[Round]) -> dict[str, int]:
    lost = duplicated = reordered = 0
    for r in rounds:
        for v in r.viewers:
            seen = set(v.seqs)
            lost += sum(1 for s in range(v.start_seq + 1, r.last_seq + 1) if s not in seen)
            duplicated += len(v.seqs) - len(seen)
            reordered += sum(1 for a, b in zip(v.seqs, v.seqs[1:], strict=False) if b < a)
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered}


def report(args: argparse.Namespace, rounds: list[Round], before: dict[str, int],
           log_path: Path) -> None:
    viewers = [v for r in rounds for v in r.viewers]
    latencies = [x for v in viewers for x in v.latencies]
    failed: dict[str, int] = {}
    broken: dict[str, int] = {}
    for v in viewers:
        if v.failed:
            failed[v.failed] = failed.get(v.failed, 0) + 1
        for cause, n in v.broken.items():
            broken[cause] = broken.get(cause, 0) + n
    print(f"command: {kit.command_line()}")
    print(f"viewers {args.viewers} x {len(rounds)} round(s), {args.rate:g} events/s in calls "
          f"of {args.batch}, {args.seconds:g} s, quiet {args.quiet:g} s, leave {args.leave}, "
          f"panel {args.url or args.app_dir}")
    print(f"connected           {sum(v.connected for v in viewers)}/{len(viewers)}")
    print(f"got every event     {sum(v.done for v in viewers)}/{len(viewers)}")
    print(f"gave up on          {failed or 0}")
    print(f"streams cut off     {broken or 0}")
    print(f"reconnects          {sum(v.reconnects for v in viewers)}")
    print(f"keep-alives seen    {sum(v.keepalives for v in viewers)}")
    print(f"events delivered    {len(latencies)}")
    print(f"latency p50         {kit.ms(kit.percentile(latencies, 50))}")
    print(f"latency p99         {kit.ms(kit.percentile(latencies, 99))}")
    print(f"latency max         {kit.ms(max(latencies, default=float('nan')))}")
    for name, n in tally(rounds).items():
        print(f"{name:<20}{n}")
    print(f"panel's pg sessions before   {kit.show_counts(before)}")
    for i, r in enumerate(rounds, 1):
        print(f"  round {i}: peak {kit.show_counts(r.peak)}; after {kit.show_counts(r.after)}")
    print(f"panel log: {log_path}")


if __name__ == "__main__":
    main()
