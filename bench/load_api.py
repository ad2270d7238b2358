"""API clients polling one deployment's status, against the panel as compose runs it, each
figure beside /healthz and a bare ASGI app measured in the same run.

    python bench/load_api.py --database-url postgres://USER@HOST:PORT/DB \\
        --redis-url redis://HOST:PORT/N [--clients 200] [--seconds 8] [--rounds 3] \\
        [--rate 200] [--open-seconds 10] [--events 20000] [--profile DIR]

The panel is started as the panel image's `web` role serves it (`docker/panel/entrypoint.sh
serve`: uvicorn with one process per core, production settings: DEBUG off, the shipped
database pool); the reference, a bare ASGI app (bench/bare_asgi.py), is served by the same
command. The deployment polled has --events log events, alert raises and clears, metric
points and capture progress, and while the clients poll, a writer stores a metric point and
a decode line every 2 s through the product's services, as the engine agent does.

Closed loop (--rounds rounds, the order rotated each round; medians printed): --clients
keep-alive clients, back to back for --seconds, on one path each: the bare app, /healthz,
deployment detail and summary with token auth; then detail and summary again as a polling
dashboard asks them, with If-None-Match from the previous answer (304 counts as an answer).
Open loop: --rate requests/s offered over --clients connections for --open-seconds (latency
from each request's scheduled time, so a late answer also delays the ones behind it).
Errors are any other status or a broken connection (the target is 0). Each closed-loop row
also has the CPU a request cost: µs of the serving processes (/proc: user and system) and
of this database's PostgreSQL backends per answer, and /healthz's cost over the row's (a
ratio that others' load on the cores moves far less than the req/s). Also printed: the
panel's PostgreSQL sessions at peak, and the `uptime` load before and after.
--profile DIR records the panel's processes with py-spy during one closed-loop round of
detail and summary (DIR/panel-<pid>.txt, collapsed stacks).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import _loadkit as kit

ENTRYPOINT = kit.ROOT / "docker" / "panel" / "entrypoint.sh"
METRICS_TOKEN = secrets.token_urlsafe(24)  # the started panel's /metrics, for its counters
WRITE_EVERY_S = 2.0  # the engine monitor's scrape interval (APPLIANCE_METRICS_INTERVAL_S)
SPEC = {"name": "bench-api", "recipe": "kimi-k2.6-ddtree", "gpus": [0], "extra_args": [],
        "engine": {"model_path": "/models/Kimi-K2.6", "tp_size": 1, "trust_remote_code": True,
                   "speculative_algorithm": "DDTREE", "speculative_num_draft_tokens": 8,
                   "speculative_draft_model_path": "/models/Kimi-K2.6-DFlash",
                   "speculative_ddtree_budget": 32, "attention_backend": "fa3"}}


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    not_modified: int = 0
    started_at: float = 0.0
    done_at: float = 0.0  # the last answer's time
    server_cpu_s: float = 0.0  # CPU of the server's processes during the loop
    pg_cpu_s: float = 0.0  # CPU of PostgreSQL's backends of the bench's database
    client_cpu_s: list[float] = field(default_factory=list)  # each client process's CPU
    load: str = ""  # the machine's load average when the loop ended
    answered_by: dict[str, float] = field(default_factory=dict)  # the panel's counter's delta

    def answered_per_s(self) -> float:
        span = self.done_at - self.started_at
        return len(self.latencies) / span if span > 0 else 0.0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def merge(self, other: Tally) -> None:
        """Another client process's tally of the same loop, into this one."""
        self.latencies.extend(other.latencies)
        for what, n in other.errors.items():
            self.errors[what] = self.errors.get(what, 0) + n
        self.not_modified += other.not_modified
        self.started_at = min(self.started_at or other.started_at, other.started_at)
        self.done_at = max(self.done_at, other.done_at)
        self.client_cpu_s.extend(other.client_cpu_s)


@dataclass(frozen=True)
class Target:
    name: str
    base: str  # the server's URL
    path: str
    conditional: bool = False  # send If-None-Match with the last ETag, as a browser does


async def ask(http: kit.Http, target: Target, headers: dict[str, str], etag: str,
              tally: Tally, scheduled: float) -> str:
    """One request; returns the ETag to send next time."""
    sent = dict(headers, **({"If-None-Match": etag} if target.conditional and etag else {}))
    try:
        status, answer = await http.get(target.path, sent)
        await http.body(answer)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        tally.error(type(exc).__name__)
        http.close()
        return etag
    if status == 200 or (status == 304 and target.conditional):
        tally.done_at = time.monotonic()
        tally.latencies.append(tally.done_at - scheduled)
        tally.not_modified += status == 304
    else:
        tally.error(f"HTTP {status}")
    if answer.get("connection", "").lower() == "close":
        http.close()
    return answer.get("etag", etag)


async def closed_client(target: Target, headers: dict[str, str], until: float,
                        tally: Tally) -> None:
    http = kit.Http(target.base)
    etag = ""
    while time.monotonic() < until:
        etag = await ask(http, target, headers, etag, tally, time.monotonic())
    http.close()


async def closed_loop(target: Target, headers: dict[str, str], clients: int,
                      seconds: float, start: float = 0.0) -> Tally:
    """`clients` keep-alive clients back to back from `start` (monotonic; now if 0)."""
    tally = Tally()
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    tally.started_at = time.monotonic()
    until = tally.started_at + seconds
    await asyncio.gather(*(closed_client(target, headers, until, tally)
                           for _ in range(clients)))
    return tally


async def open_connection_worker(target: Target, headers: dict[str, str],
                                 due: asyncio.Queue[float | None], tally: Tally) -> None:
    http = kit.Http(target.base)
    etag = ""
    while (scheduled := await due.get()) is not None:
        etag = await ask(http, target, headers, etag, tally, scheduled)
    http.close()


async def open_loop(target: Target, headers: dict[str, str], rate: float, connections: int,
                    seconds: float, start: float = 0.0, offset: float = 0.0) -> Tally:
    """`rate` requests/s on a fixed schedule from `start` (+ `offset`: the other client
    processes' share of the schedule interleaves), round-robin over `connections`."""
    tally = Tally()
    queues: list[asyncio.Queue[float | None]] = [asyncio.Queue() for _ in range(connections)]
    workers = [asyncio.create_task(open_connection_worker(target, headers, q, tally))
               for q in queues]
    start = (start or time.monotonic() + 0.5) + offset
    tally.started_at = start
    for i in range(int(rate * seconds)):
        scheduled = start + i / rate
        await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
        queues[i % connections].put_nowait(scheduled)
    for q in queues:
        q.put_nowait(None)
    await asyncio.gather(*workers)
    return tally


@dataclass(frozen=True)
class Job:
    """One client process's part of a loop."""

    target: Target
    headers: dict[str, str]
    clients: int
    seconds: float
    start: float  # monotonic (the same clock in every process of the machine)
    rate: float = 0.0  # open loop: this process's share of the offered rate
    offset: float = 0.0


def client_process(job: Job) -> Tally:
    """A client process's loop (closed, or open where a rate is given), with its CPU."""
    cpu = time.process_time()
    if job.rate:
        tally = kit.run_fast(open_loop(job.target, job.headers, job.rate, job.clients,
                                       job.seconds, job.start, job.offset))
    else:
        tally = kit.run_fast(closed_loop(job.target, job.headers, job.clients, job.seconds,
                                         job.start))
    tally.client_cpu_s = [time.process_time() - cpu]
    return tally


class Clients:
    """The bench's clients, spread over `procs` processes (one Python process of asyncio
    clients tops out near a core: a figure it set would be the client's)."""

    def __init__(self, procs: int) -> None:
        self.procs = procs
        self.pool = ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn"))
        list(self.pool.map(time.sleep, [0.0] * procs))  # started before any figure

    def closed(self, target: Target, headers: dict[str, str], clients: int,
               seconds: float) -> Tally:
        start = time.monotonic() + 0.3
        shares = [clients // self.procs + (i < clients % self.procs) for i in range(self.procs)]
        return self._gather([Job(target, headers, n, seconds, start) for n in shares if n])

    def open(self, target: Target, headers: dict[str, str], rate: float, connections: int,
             seconds: float) -> Tally:
        start = time.monotonic() + 0.5
        n = self.procs
        return self._gather([Job(target, headers, max(1, connections // n), seconds, start,
                                 rate / n, i / rate) for i in range(n)])

    def _gather(self, jobs: list[Job]) -> Tally:
        tally = Tally()
        for part in self.pool.map(client_process, jobs):
            tally.merge(part)
        tally.load = kit.load_average()
        return tally

    def close(self) -> None:
        self.pool.shutdown()


# ------------------------------------------------------------------ the deployment


def seed_deployment(events: int) -> int:
    """A deployment as a serving one looks: a real spec, a long log, alerts, points."""
    from appliance.runtime import series
    from appliance.runtime.alerts import Alert
    from web.deployments import selectors, services
    from web.deployments.models import Deployment
    from web.deployments.services.metrics import deployment_apply_alerts, metrics_store_point

    # The graph widths as deployment_create keeps them (without, every summary parses the
    # spec: a row from before migration 0009, which backfills them).
    deployment = Deployment.objects.create(
        name="bench-api", spec=SPEC, recipe="kimi-k2.6-ddtree",
        algorithm="DDTREE", gpus=[0], status="ready", engine_url="http://engine:30000",
        graph_needed=selectors.spec_graph_widths(spec=SPEC))
    pk = deployment.pk
    for start in range(0, events, 1000):
        services.events_append(deployment_id=pk, events=[
            ("log", {"text": f"Decode batch. #running-req: 8, line {start + i}"})
            for i in range(min(1000, events - start))])
    services.deployment_set_progress(deployment_id=pk, progress={
        "widths": {"target": {"captured": 33}},
        "captures": [{"role": "target", "mode": "verify", "mem_usage_gb": 2.39}]})
    stall = Alert(id="stall", state="firing", severity="warning", summary="no progress")
    deployment_apply_alerts(deployment_id=pk, alerts=[stall])
    deployment_apply_alerts(deployment_id=pk, alerts=[
        Alert(id="stall", state="resolved", severity="warning", summary="progress again")])
    now = time.time()
    for i in range(30):
        metrics_store_point(deployment_id=pk, resolution_s=2, point=series.MetricPoint(
            t=now - 60 + 2 * i, throughput=1000.0 + i, accept_len=4.2, gpus=[[90.0, 70.0, 80.0]]))
    return pk


def write_state(pk: int, stop: threading.Event) -> None:
    """What the engine agent writes while the engine serves: a point, and a decode line as
    its follower ships one (events_append_batch: the line, its decode stats, the row's log
    cursor and last stats in one statement; the status reads' answers stored at most twice
    a second after such batches)."""
    from django.db import connection

    from appliance.runtime import series
    from web.deployments import services
    from web.deployments.services.metrics import metrics_store_point

    n = 0
    while not stop.wait(WRITE_EVERY_S):
        n += 1
        metrics_store_point(deployment_id=pk, resolution_s=2, point=series.MetricPoint(
            t=time.time(), throughput=1000.0 + n % 50, accept_len=4.2, gpus=[[90.0, 70.0, 80.0]]))
        decode = {"kind": "decode_stats", "running_req": 8, "gen_throughput": 1000.0 + n % 50}
        services.events_append_batch(deployment_id=pk, events=[
            ("log", {"text": f"Decode batch. #running-req: 8, writer line {n}"}),
            ("metric", decode)], row={"log_cursor": f"bench-{n}", "decode_stats": decode})
    connection.close()


def hold_lease(stop: threading.Event, every_tick: bool) -> None:
    """What the engine agent writes every tick (AGENT_TICK_S) while the reads run: the own
    host's agent holds its host (web/fleet/services.py host_agent_claim: the host's row,
    renewed once a third of the lease is spent) and beats on the host's row; no deployment
    row. With `every_tick`, each watched row's lease renewed every tick instead, as the
    first agent did (each renewal a new row version: the stored answers stale, every read
    rendered again), for the old behaviour side by side."""

    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from appliance.lifecycle import AGENT_OWNED
    from web.deployments.models import Deployment
    from web.fleet.agentlease import host_agent_claim
    from web.fleet.models import FleetHost, unjoined_credential

    host, _ = FleetHost.objects.get_or_create(
        name=settings.HOST_NAME,
        defaults={"credential_made_at": timezone.now(), **unjoined_credential()})
    while True:
        now = timezone.now()
        if every_tick:
            Deployment.objects.filter(status__in=AGENT_OWNED).update(
                agent_id=f"agent@{host.name}")
        else:
            host_agent_claim(host=host, session="bench-agent")
            FleetHost.objects.filter(pk=host.pk).update(heartbeat_at=now)
        if stop.wait(settings.AGENT_TICK_S):
            break
    connection.close()


# ------------------------------------------------------------------ the servers


@dataclass(frozen=True)
class Server:
    url: str
    pid: int  # uvicorn's supervisor; its children serve


@contextmanager
def served(args: argparse.Namespace, app: str, log_path: Path) -> Iterator[Server]:
    """`entrypoint.sh serve APP` on a free port of the loopback, as compose runs the panel."""
    port = free_port()
    env = dict(os.environ)
    env.pop("APPLIANCE_DEBUG", None)
    env.update(
        APPLIANCE_DATABASE_URL=args.database_url, APPLIANCE_REDIS_URL=args.redis_url,
        APPLIANCE_SECRET_KEY=secrets.token_urlsafe(48), DJANGO_SETTINGS_MODULE="web.settings",
        PYTHONUNBUFFERED="1", PGAPPNAME=kit.PANEL_APP_NAME,
        PYTHONPATH=os.pathsep.join([str(kit.ROOT), str(kit.ROOT / "bench")]),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PROMETHEUS_MULTIPROC_DIR=tempfile.mkdtemp(prefix="load-api-prom-"),
        APPLIANCE_METRICS_TOKEN=METRICS_TOKEN)
    env.update(item.split("=", 1) for item in args.server_env)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["sh", str(ENTRYPOINT), "serve", app, "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning"],
            cwd=kit.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            kit.wait_healthy(url, proc, log_path, timeout_s=60)
            yield Server(url, proc.pid)
        finally:
            proc.terminate()  # uvicorn's supervisor stops its workers
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serving_pids(server: Server) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True)
    return [server.pid, *(int(p) for p in out.stdout.split())]


@contextmanager
def profiled(directory: Path | None, server: Server) -> Iterator[None]:
    """py-spy on each of the panel's processes, while the block runs."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    spy = os.environ.get("PY_SPY", "py-spy")
    spies = [subprocess.Popen([spy, "record", "-p", str(pid), "-r", "50", "--nonblocking",
                               "-f", "raw", "-o", str(directory / f"panel-{pid}.txt")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for pid in serving_pids(server)]
    time.sleep(1)  # attached before the load starts
    try:
        yield
    finally:
        for spy_proc in spies:
            spy_proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy_proc.wait(timeout=60)


# ------------------------------------------------------------------ the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kit.add_common_args(parser)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--open-seconds", type=float, default=10)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--client-procs", type=int, default=2,
                        help="processes the clients are spread over")
    parser.add_argument("--lease-every-tick", action="store_true",
                        help="renew the agent's lease every tick, as the agent did before "
                        "it kept a lease (the old behaviour, side by side)")
    args = parser.parse_args()
    kit.setup_django(args)
    _, token = kit.bench_user()
    pk = seed_deployment(args.events)
    headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
    logs = Path(tempfile.mkdtemp(prefix="load-api-"))
    load_before = uptime()
    pg = kit.PgConnections(args)
    stop = threading.Event()
    writer = threading.Thread(target=write_state, args=(pk, stop), daemon=True)
    lease = threading.Thread(target=hold_lease, args=(stop, args.lease_every_tick), daemon=True)
    lease.start()  # the agent watches the row from before the first read, as it does served
    clients = Clients(args.client_procs)
    peak: dict[str, int] = {}
    with served(args, "web.asgi:application", logs / "panel.log") as panel, \
            served(args, "bare_asgi:app", logs / "bare.log") as bare:
        detail, summary = f"/api/deployments/{pk}/", f"/api/deployments/{pk}/summary/"
        closed = [Target("bare ASGI app", bare.url, "/healthz"),
                  Target("/healthz", panel.url, "/healthz"),
                  Target("detail", panel.url, detail), Target("summary", panel.url, summary),
                  Target("detail, If-None-Match", panel.url, detail, True),
                  Target("summary, If-None-Match", panel.url, summary, True)]
        for target in closed:  # warm: imports, first queries, every server process
            clients.closed(target, headers, 8, 0.5)
        writer.start()
        sampler = threading.Thread(target=sample_peak, args=(pg, stop, peak), daemon=True)
        sampler.start()
        cpu = CpuMeter(pg, [panel, bare], panel)
        rounds = []
        for r in range(args.rounds):
            rounds.append(run_round(args, closed, headers, r, cpu, clients))
        with profiled(args.profile, panel):
            if args.profile:
                for target in closed[2:4]:
                    clients.closed(target, headers, args.clients, args.seconds)
        opened = {t.name: cpu.measured(t, lambda t=t: clients.open(
            t, headers, args.rate, args.clients, args.open_seconds)) for t in closed[1:]}
        stop.set()
        writer.join()
        lease.join()
    clients.close()
    report(args, closed, rounds, opened, peak, load_before, uptime(), logs)
    pg.close()


def run_round(args: argparse.Namespace, targets: list[Target], headers: dict[str, str],
              r: int, cpu: CpuMeter, clients: Clients) -> dict[str, Tally]:
    order = targets[r % len(targets):] + targets[:r % len(targets)]
    return {t.name: cpu.measured(t, lambda t=t: clients.closed(
        t, headers, args.clients, args.seconds)) for t in order}


class CpuMeter:
    """CPU seconds (/proc: user and system) that the server behind a target and this
    database's PostgreSQL backends spent while a loop ran: the cost of a request on these
    cores whatever else shares them, beside the throughput that others' load moves."""

    def __init__(self, pg: kit.PgConnections, servers: list[Server], panel: Server) -> None:
        self.pg = pg
        self.servers = {server.url: server for server in servers}
        self.panel = panel

    def measured(self, target: Target, loop: Callable[[], Tally]) -> Tally:
        pids = serving_pids(self.servers[target.base])
        server, backends = kit.cpu_seconds(pids), kit.cpu_seconds(self.backends())
        by = answered_by(self.panel)
        tally = loop()
        tally.server_cpu_s = kit.cpu_seconds(pids) - server
        tally.pg_cpu_s = kit.cpu_seconds(self.backends()) - backends
        after = answered_by(self.panel)
        tally.answered_by = {k: after.get(k, 0) - by.get(k, 0) for k in after}
        return tally

    def backends(self) -> list[int]:
        rows = self.pg.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [self.pg.name]).fetchall()
        return [pid for (pid,) in rows]


def answered_by(panel: Server) -> dict[str, float]:
    """The panel's status reads by the path that answered them (its /metrics counter)."""
    import requests

    text = requests.get(f"{panel.url}/metrics", timeout=10,
                        headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    found = re.findall(r'appliance_status_reads_total\{answered_by="(\w+)"\} (\S+)', text)
    return {name: float(value) for name, value in found}


def sample_peak(pg: kit.PgConnections, stop: threading.Event, peak: dict[str, int]) -> None:
    while not stop.wait(0.25):
        counts = pg.count()
        if counts["total"] > peak.get("total", -1):
            peak.clear()
            peak.update(counts)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# ------------------------------------------------------------------ the report


def report(args: argparse.Namespace, targets: list[Target], rounds: list[dict[str, Tally]],
           opened: dict[str, Tally], peak: dict[str, int], load_before: str, load_after: str,
           logs: Path) -> None:
    print(f"command: {kit.command_line()}")
    print(f"server: sh docker/panel/entrypoint.sh serve APP ({server_processes()} processes); "
          f"{args.clients} clients in {args.client_procs} processes; agent lease "
          f"{'renewed every tick (old)' if args.lease_every_tick else 'kept (the agent)'}; "
          f"logs in {logs}")
    print(f"load before: {load_before}\nload after:  {load_after}")
    print(f"\nclosed loop, {args.clients} keep-alive clients, {args.seconds:g} s each, "
          f"median of {len(rounds)} rounds (min-max of req/s); client: the client processes' "
          f"CPU, the busiest round (a figure is withheld where one process used "
          f"{kit.CLIENT_BOUND_SHARE:.0%} of a core or more); fast: the share of status reads "
          f"answered before Django (stored body / rendered), from the panel's counter")
    print(f"{'':24} {'req/s':>16} {'x /healthz':>10} {'x bare':>7} {'p50':>9} {'p99':>9} "
          f"{'304':>5} {'errors':>6} {'server µs':>9} {'pg µs':>6} {'CPU x /healthz':>14} "
          f"{'client':>16} {'fast':>13}  load by round")
    bound = {t.name: any(client_bound(r[t.name], args.seconds) for r in rounds)
             for t in targets}
    for t in targets:
        rates = [len(r[t.name].latencies) / args.seconds for r in rounds]
        lat = [x for r in rounds for x in r[t.name].latencies]
        answered = len(lat) or 1
        share = sum(r[t.name].not_modified for r in rounds) / answered
        errors = sum(sum(r[t.name].errors.values()) for r in rounds)
        server, pg = cpu_per_request(rounds, t.name)
        by_cpu = sum(cpu_per_request(rounds, "/healthz")) / ((server + pg) or float("nan"))
        busiest = max((r[t.name] for r in rounds), key=lambda x: max(x.client_cpu_s or [0]))
        client, _ = kit.client_verdict(busiest.client_cpu_s, args.seconds)
        loads = ", ".join(r[t.name].load.split()[0] for r in rounds)
        if bound[t.name] or bound["/healthz"] or bound["bare ASGI app"]:
            print(f"{t.name:24} {'client-bound':>16} {'-':>10} {'-':>7} {'-':>9} {'-':>9} "
                  f"{'':>5} {errors:>6} {'':>9} {'':>6} {'':>14} {client:>16} "
                  f"{fast_share(rounds, t.name):>13}  {loads}")
            continue
        ratio = statistics.median(rate(r, t.name, args) / rate(r, "/healthz", args)
                                  for r in rounds)
        vs_bare = statistics.median(rate(r, t.name, args) / rate(r, "bare ASGI app", args)
                                    for r in rounds)
        spread = f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})"
        print(f"{t.name:24} {spread:>16} {ratio:>10.2f} {vs_bare:>7.2f} "
              f"{ms(kit.percentile(lat, 50)):>9} {ms(kit.percentile(lat, 99)):>9} "
              f"{share:>5.0%} {errors:>6} {server:>9.0f} {pg:>6.0f} {by_cpu:>14.2f} "
              f"{client:>16} {fast_share(rounds, t.name):>13}  {loads}")
    print(f"\nopen loop, {args.rate:g} req/s offered over {args.clients} connections, "
          f"{args.open_seconds:g} s each")
    print(f"{'':24} {'answered/s':>10} {'p50':>9} {'p99':>9} {'max':>9} {'errors':>6} "
          f"{'client':>16} {'fast':>13}  load")
    for name, tally in opened.items():
        lat = tally.latencies
        wall = args.open_seconds + 0.5
        client, limited = kit.client_verdict(tally.client_cpu_s, wall)
        figures = (f"{ms(kit.percentile(lat, 50)):>9} {ms(kit.percentile(lat, 99)):>9} "
                   f"{ms(max(lat, default=float('nan'))):>9}")
        if limited:
            figures = f"{'client-bound':>29}"
        print(f"{name:24} {tally.answered_per_s():>10.0f} {figures} "
              f"{sum(tally.errors.values()):>6} {client:>16} {fast_share([opened], name):>13}  "
              f"{tally.load.split()[0]} {tally.errors or ''}")
    print(f"\npanel's pg sessions at peak: {kit.show_counts(peak) if peak else 'none seen'}")


def client_bound(tally: Tally, seconds: float) -> bool:
    return kit.client_verdict(tally.client_cpu_s, seconds)[1]


def fast_share(rounds: list[dict[str, Tally]], name: str) -> str:
    """The share of the loop's status reads answered before Django: stored / rendered."""
    counts: dict[str, float] = {}
    for r in rounds:
        for k, n in r[name].answered_by.items():
            counts[k] = counts.get(k, 0) + n
    total = sum(counts.values())
    if not total:
        return "-"
    return (f"{counts.get('asgi_stored', 0) / total:.0%} / "
            f"{counts.get('asgi_rendered', 0) / total:.0%}")


def cpu_per_request(rounds: list[dict[str, Tally]], name: str) -> tuple[float, float]:
    """µs of the server's CPU and of PostgreSQL's per answer, over all rounds."""
    answered = sum(len(r[name].latencies) for r in rounds) or 1
    return (sum(r[name].server_cpu_s for r in rounds) / answered * 1e6,
            sum(r[name].pg_cpu_s for r in rounds) / answered * 1e6)


def rate(r: dict[str, Tally], name: str, args: argparse.Namespace) -> float:
    return len(r[name].latencies) / args.seconds


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def server_processes() -> str:
    cores = len(os.sched_getaffinity(0))
    return os.environ.get("APPLIANCE_WEB_WORKERS") or f"min(cores, 4) = {min(cores, 4)}"


if __name__ == "__main__":
    main()
