"""Many API clients polling one deployment's status, against a production-like panel.

    python bench/load_api.py --database-url postgres://USER@HOST:PORT/DB \\
        --redis-url redis://HOST:PORT/N [--clients 200] [--seconds 20]

Each client keeps one connection open and alternates GET /api/deployments/<id>/ and
GET /api/deployments/<id>/summary/ with token auth, back to back, for --seconds.
Prints requests/s, errors (any non-200 or broken connection; the target is 0),
p50/p99 latency, and the PostgreSQL sessions on the database before, at peak during,
and after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import _loadkit as kit


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def client(url: str, paths: list[str], token: str, until: float, tally: Tally) -> None:
    http = kit.Http(url)
    headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
    turn = 0
    while time.monotonic() < until:
        path = paths[turn % len(paths)]
        turn += 1
        started = time.monotonic()
        try:
            status, answer = await http.get(path, headers)
            await http.body(answer)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            tally.error(type(exc).__name__)
            http.close()
            continue
        if status != 200:
            tally.error(f"HTTP {status}")
        else:
            tally.latencies.append(time.monotonic() - started)
        if answer.get("connection", "").lower() == "close":
            http.close()
    http.close()


async def run_clients(url: str, paths: list[str], token: str, n: int, seconds: float) -> Tally:
    tally = Tally()
    until = time.monotonic() + seconds
    await asyncio.gather(*(client(url, paths, token, until, tally) for _ in range(n)))
    return tally


def sample_peak(pg: kit.PgConnections, stop: threading.Event, peak: dict[str, int]) -> None:
    while not stop.wait(0.25):
        counts = pg.count()
        if counts["total"] > peak.get("total", -1):
            peak.clear()
            peak.update(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kit.add_common_args(parser)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    kit.setup_django(args)
    _, token = kit.bench_user()
    pk = kit.bench_deployment("bench-api").pk
    paths = [f"/api/deployments/{pk}/", f"/api/deployments/{pk}/summary/"]
    log_path = Path(tempfile.mkdtemp(prefix="load-api-")) / "panel.log"
    pg = kit.PgConnections(args)
    with kit.panel(args, log_path) as url:
        asyncio.run(run_clients(url, paths, token, 2, 1.0))  # warm: imports, first queries
        before = pg.count()
        peak: dict[str, int] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=sample_peak, args=(pg, stop, peak))
        sampler.start()
        tally = asyncio.run(run_clients(url, paths, token, args.clients, args.seconds))
        stop.set()
        sampler.join()
        after = kit.settle(pg, before["total"], 10)
    report(args, tally, before, peak, after, log_path)
    pg.close()


def report(args: argparse.Namespace, tally: Tally, before: dict[str, int],
           peak: dict[str, int], after: dict[str, int], log_path: Path) -> None:
    done = len(tally.latencies)
    errors = sum(tally.errors.values())
    print(f"command: {kit.command_line()}")
    print(f"clients {args.clients}, {args.seconds:g} s, panel {args.url or args.app_dir}")
    print(f"requests ok     {done} ({done / args.seconds:.0f}/s)")
    print(f"errors          {errors} {tally.errors or ''}")
    print(f"latency p50     {kit.ms(kit.percentile(tally.latencies, 50))}")
    print(f"latency p99     {kit.ms(kit.percentile(tally.latencies, 99))}")
    print(f"latency max     {kit.ms(max(tally.latencies, default=float('nan')))}")
    print(f"panel's pg sessions before  {kit.show_counts(before)}")
    print(f"panel's pg sessions peak    {kit.show_counts(peak or before)}")
    print(f"panel's pg sessions after   {kit.show_counts(after)}")
    print(f"panel log: {log_path}")


if __name__ == "__main__":
    main()
