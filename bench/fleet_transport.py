"""How a remote GPU host's agent should store its engines' events: through an ingest API
on the panel, or straight into PostgreSQL (and Redis) with a role of its own.

Three "hosts" log at once, each a process producing SGLang decode lines at --rate lines/s
(default 10,000) for --seconds, batched as the engine agent's follower batches them
(every --batch-ms, at most --batch-lines lines; each decode line is two events, the log
line and its decode_stats metric, as appliance.runtime.follower makes them, with the
log cursor and the last decode stats set on the deployment's row with each batch).
Candidates, each on the production road:

  ingest      each host POSTs its batches to the panel's ingest endpoint
              (/api/fleet/host/deployments/<id>/events/, web/fleet/hostapi.py), with its
              own credential, to a panel started as the image starts it (uvicorn
              web.asgi:application, one process); the panel checks the host's placement,
              stores the batch with events_append_batch and publishes it live.
  direct      each host calls events_append_batch itself on its own PostgreSQL
              connection (what the panel's own agent does today) and publishes to Redis.
  direct-rls  as direct, but each host connects as a PostgreSQL role of its own, with
              row-level security on the event and deployment tables: a row is written only
              for a deployment placed on that host (the policy a PostgreSQL transport would
              need; made here on the bench database only).

Figures per candidate: lines/s stored per host, each batch's latency (p50, p99, max),
how far behind its schedule each host fell, lines lost or duplicated in the database,
whether the live stream (what the pages show) holds the last event, and CPU per 1,000
lines of each part (the panel, PostgreSQL's backends, the hosts, Redis).

    .venv/bin/python bench/fleet_transport.py \\
        --database-url postgres://appliance@127.0.0.1:5440/appliance_fleetbench \\
        --redis-url redis://127.0.0.1:6390/8 --rate 10000 --seconds 20

With --agent-encode, only a host agent's own CPU per decode line before the request: its
sink's `batches(masked(host_kinds(events), key))` and the body's encoding, over --lines
lines in batches of --batch-lines, against the road as it was before each event was
encoded once (json.dumps per payload to size the batch, then of the whole body):

    .venv/bin/python bench/fleet_transport.py --agent-encode

Shortcuts, printed beside the figures: one machine runs the panel, PostgreSQL, Redis and
the three hosts (on a real fleet each host is its own machine and its CPU is not the
panel's); no TLS on loopback; the hosts' lines are made in memory, not read from Docker.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOSTS = ("bench-host-1", "bench-host-2", "bench-host-3")
ROLE_PREFIX = "fleet_bench_"


# ------------------------------------------------------------------ a host's lines


def decode_batch(host: int, first: int, last: int, t: float) -> list[tuple[str, dict[str, Any]]]:
    """The follower's events for decode lines first..last-1: a log line and its metric."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 10**6:06d}"
    events: list[tuple[str, dict[str, Any]]] = []
    for i in range(first, last):
        text = (f"[{stamp} TP0] Decode batch, #running-req: 3, #token: {i}, token usage: "
                f"0.05, accept len: 3.21, accept rate: 0.40, cuda graph: True, gen throughput "
                f"(token/s): 512.30, #queue-req: {host}")
        events.append(("log", {"stream": "stdout", "text": text}))
        events.append(("metric", {"line": i + 1, "kind": "decode_stats", "running_req": 3,
                                  "tokens": i, "token_usage": 0.05, "accept_len": 3.21,
                                  "accept_rate": 0.4, "cuda_graph": True,
                                  "gen_throughput": 512.3, "queue_req": host, "tp": 0}))
    return events


def _old_road(events: list[tuple[str, dict[str, Any]]], key: str,
              row: dict[str, Any]) -> tuple[float, float]:
    """The sink's road before each event was encoded once (reproduced for comparison): each
    payload's json.dumps to size the batch, then the body's json.dumps. CPU s of each."""
    from appliance.runtime.host_sink import MAX_BATCH_BYTES, host_kinds, masked

    began = time.process_time()
    parts: list[list[tuple[str, dict[str, Any]]]] = [[]]
    size = 0
    for kind, payload in masked(host_kinds(events), key):
        cost = len(json.dumps(payload, separators=(",", ":"))) + len(kind) + 8
        if parts[-1] and size + cost > MAX_BATCH_BYTES:
            parts.append([])
            size = 0
        parts[-1].append((kind, payload))
        size += cost
    sized = time.process_time()
    for part in parts:
        json.dumps({"events": [[k, p] for k, p in part], "row": row}, separators=(",", ":"))
    return sized - began, time.process_time() - sized


def _this_road(events: list[tuple[str, dict[str, Any]]], key: str,
               row: dict[str, Any]) -> tuple[float, float]:
    """RemoteSink.ship's road: batches of events encoded once, each body joined from them."""
    from appliance.runtime.host_sink import batches, host_kinds, masked
    from appliance.runtime.panel_link import events_body

    began = time.process_time()
    parts = batches(masked(host_kinds(events), key))
    sized = time.process_time()
    for part in parts:
        events_body(part.encoded, row=row, start_token="t" * 32, after="1767225600000000000:1")
    return sized - began, time.process_time() - sized


def agent_encode(args: argparse.Namespace) -> None:
    """CPU µs per decode line of a host agent's batching and body encoding, both roads."""
    key = "a1b2c3d4" * 8  # an engine's API key: masked in every text (none holds it here)
    made = [decode_batch(1, first, min(first + args.batch_lines, args.lines),
                         1767225600.0 + first) for first in range(0, args.lines,
                                                                  args.batch_lines)]
    print(f"lines: {args.lines} in batches of {args.batch_lines} ({len(made[0])} events a "
          f"batch, {len(json.dumps(made[0][:2]))} bytes of JSON a line), "
          f"{args.repeats} runs each, CPU time (time.process_time)")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for name, road in (("before (json.dumps twice)", _old_road),
                       ("encoded once", _this_road)):
        runs = []
        for _ in range(args.repeats):
            sizing = body = 0.0
            for events in made:
                row = {"log_cursor": "1767225600000000000:2", "decode_stats": events[-1][1]}
                s, b = road(events, key, row)
                sizing, body = sizing + s, body + b
            runs.append((sizing + body, sizing, body))
        runs.sort()
        total, sizing, body = runs[len(runs) // 2]
        per = 1e6 / args.lines
        print(f"  {name:26s} median {total * per:5.1f} µs a line (batches(masked(host_kinds)) "
              f"{sizing * per:.1f}, body {body * per:.1f}); best {runs[0][0] * per:.1f}",
              flush=True)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def paced(args: argparse.Namespace, host: int, store: Any) -> dict[str, Any]:
    """Produce lines at the rate, store each batch with `store(events, row)`; figures."""
    n = int(args.rate * args.seconds)
    batch_s, limit = args.batch_ms / 1000, args.batch_lines
    latencies, behind, sent = [], 0.0, 0
    start = time.monotonic()
    while sent < n:
        now = time.monotonic()
        due = min(n, int((now - start) * args.rate))
        if due <= sent:
            time.sleep(min(batch_s, start + (sent + 1) / args.rate - now))
            continue
        behind = max(behind, (due - sent) / args.rate - batch_s)
        last = min(due, sent + limit)
        events = decode_batch(host, sent, last, time.time())
        row = {"log_cursor": f"{time.time():.6f}", "decode_stats": events[-1][1]}
        began = time.monotonic()
        store(events, row)
        latencies.append(time.monotonic() - began)
        sent = last
        pause = batch_s - (time.monotonic() - now)
        if pause > 0 and sent < min(n, int((time.monotonic() - start) * args.rate)) + limit:
            time.sleep(pause)
    wall = time.monotonic() - start
    ordered = sorted(latencies)
    return {"lines": sent, "wall_s": wall, "lines_per_s": sent / wall,
            "batches": len(latencies), "batch_p50_ms": 1000 * ordered[len(ordered) // 2],
            "batch_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "batch_max_ms": 1000 * ordered[-1], "max_behind_s": max(0.0, behind)}


def host_ingest(args: argparse.Namespace, host: int, url: str, credential: str,
                deployment_id: int) -> dict[str, Any]:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=60)
    path = f"/api/fleet/host/deployments/{deployment_id}/events/"
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}

    def store(events: list[Any], row: dict[str, Any]) -> None:
        body = json.dumps({"events": events, "row": row}, separators=(",", ":"))
        conn.request("POST", path, body=body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise SystemExit(f"ingest answered {answer.status}: {data[:300]!r}")

    store([("log", {"stream": "stdout", "text": "warm-up"})], {})  # the connection, warm
    _ready()
    return paced(args, host, store)


def host_direct(args: argparse.Namespace, host: int, deployment_id: int,
                role: str) -> dict[str, Any]:
    if role:
        os.environ["APPLIANCE_DATABASE_URL"] = _as_role(args.database_url, role)
    _django(args, migrate=False)
    from django.db import connection

    from web.deployments.services import events_append_batch

    def store(events: list[Any], row: dict[str, Any]) -> None:
        events_append_batch(deployment_id=deployment_id, events=events, row=row)

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        print(json.dumps({"backend": cursor.fetchone()[0]}), flush=True)
    _ready()
    figures = paced(args, host, store)
    _live_caught_up(deployment_id)  # this process publishes: its last batches, sent
    return figures


def _live_caught_up(deployment_id: int, limit_s: float = 30.0) -> None:
    import redis
    from django.conf import settings

    from web.deployments import live
    from web.deployments.models import Deployment

    client = redis.Redis.from_url(settings.REDIS_URL)
    last = Deployment.objects.values_list("last_seq", flat=True).get(pk=deployment_id)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        newest = client.xrevrange(live.stream_key(deployment_id), count=1)
        if newest and live.seq_of(newest[0][0]) >= last:
            return
        time.sleep(0.05)


def _ready() -> None:
    print("connected", flush=True)
    sys.stdin.readline()  # all hosts start together


def host_main(argv: list[str]) -> None:
    args = parse_args(argv[1:])
    host, mode, deployment_id = int(args.host), args.child, int(args.deployment)
    if mode == "ingest":
        figures = host_ingest(args, host, args.url, args.credential, deployment_id)
    else:
        figures = host_direct(args, host, deployment_id, args.role)
    print(json.dumps(figures), flush=True)
    sys.stdin.readline()  # the parent reads this backend's CPU before it goes


# ------------------------------------------------------------------ the panel's side


def _django(args: argparse.Namespace, *, migrate: bool) -> None:
    if migrate:
        from bench import _loadkit

        _loadkit.setup_django(args)
        return
    os.environ.setdefault("APPLIANCE_DATABASE_URL", args.database_url)
    os.environ["APPLIANCE_REDIS_URL"] = args.redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
    import django

    django.setup()


def _as_role(url: str, role: str) -> str:
    parsed = urlparse(url)
    netloc = f"{role}@{parsed.hostname}:{parsed.port}"
    return parsed._replace(netloc=netloc).geturl()


def make_hosts() -> list[tuple[str, str, int]]:
    """Three joined hosts, a deployment placed on each: (name, credential, deployment)."""
    from web.deployments.models import Deployment
    from web.fleet import services
    from web.fleet.models import FleetHost, JoinToken, Placement

    # The last run's hosts and engines (their events went at its end).
    old = list(Placement.objects.filter(host__name__in=HOSTS).values_list("deployment_id",
                                                                          flat=True))
    Placement.objects.filter(host__name__in=HOSTS).delete()
    Deployment.objects.filter(pk__in=old).delete()
    FleetHost.objects.filter(name__in=HOSTS).delete()
    JoinToken.objects.filter(host_name__in=HOSTS).delete()
    made = []
    facts = services.host_facts_from({"agent_version": "bench", "gpu_count": 8, "docker": {}})
    for name in HOSTS:
        token = services.jointoken_create(host_name=name)
        joined = services.host_join(token=token.secret, name=name, facts=facts)
        deployment = Deployment.objects.create(name=f"{name}-engine", spec={"name": name},
                                               recipe="bench", algorithm="DDTREE", gpus=[])
        services.placement_assign(deployment=deployment, host_name=name, reason="bench")
        made.append((name, joined.credential, deployment.pk))
    return made


# The policy a PostgreSQL transport would need: a host's role writes only the rows of the
# deployments placed on it. The view runs with its owner's rights (the roles read nothing
# of the fleet's tables, credentials' digests included) and names the session's host from
# its role; the policies' IN (subquery) is planned as a hashed subplan, worked out once per
# statement. (A SECURITY DEFINER function per row, the other usual form, cost PostgreSQL
# 2.3x the CPU of no policy at all in this bench's first run: it is never inlined.)
RLS_SQL = """
CREATE OR REPLACE VIEW fleet_bench_mine AS
  SELECT p.deployment_id FROM fleet_placement p JOIN fleet_fleethost h ON h.id = p.host_id
  WHERE h.name = replace(substr(session_user, {cut}), '_', '-');
ALTER TABLE deployments_event ENABLE ROW LEVEL SECURITY;
ALTER TABLE deployments_deployment ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS fleet_bench_write ON deployments_event;
CREATE POLICY fleet_bench_write ON deployments_event FOR INSERT
  WITH CHECK (deployment_id IN (SELECT deployment_id FROM fleet_bench_mine));
DROP POLICY IF EXISTS fleet_bench_rows ON deployments_deployment;
CREATE POLICY fleet_bench_rows ON deployments_deployment FOR ALL
  USING (id IN (SELECT deployment_id FROM fleet_bench_mine))
  WITH CHECK (id IN (SELECT deployment_id FROM fleet_bench_mine));
"""


def rls_setup(names: list[str]) -> list[str]:
    """A role per host with row-level security on the two tables (bench database only)."""
    from django.db import connection

    roles = [ROLE_PREFIX + name.replace("-", "_") for name in names]
    with connection.cursor() as cursor:
        for role in roles:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone() is None:
                cursor.execute(f'CREATE ROLE "{role}" LOGIN')
            cursor.execute(f'GRANT SELECT, UPDATE ON deployments_deployment TO "{role}"')
            cursor.execute(f'GRANT SELECT, INSERT ON deployments_event TO "{role}"')
            cursor.execute(f'GRANT SELECT, INSERT, UPDATE ON deployments_statusbody TO "{role}"')
        cursor.execute(RLS_SQL.replace("{cut}", str(len(ROLE_PREFIX) + 1)))
        for role in roles:
            cursor.execute(f'GRANT SELECT ON fleet_bench_mine TO "{role}"')
    return roles


def rls_teardown(roles: list[str]) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE deployments_event DISABLE ROW LEVEL SECURITY")
        cursor.execute("ALTER TABLE deployments_deployment DISABLE ROW LEVEL SECURITY")
        cursor.execute("DROP POLICY IF EXISTS fleet_bench_write ON deployments_event")
        cursor.execute("DROP POLICY IF EXISTS fleet_bench_rows ON deployments_deployment")
        for role in roles:
            cursor.execute(f'REVOKE ALL ON deployments_deployment, deployments_event, '
                           f'deployments_statusbody, fleet_bench_mine FROM "{role}"')


def rls_refuses_another_hosts_row(args: argparse.Namespace, role: str, other: int) -> str:
    """The policy's own check: host 1's role writing host 2's deployment stores nothing."""
    import psycopg

    dsn = _as_role(args.database_url, role).replace("postgres://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        updated = conn.execute("UPDATE deployments_deployment SET last_seq = last_seq "
                               "WHERE id = %s", [other]).rowcount
        try:
            conn.execute("INSERT INTO deployments_event (deployment_id, seq, ts, kind, payload) "
                         "VALUES (%s, 999999999, now(), 'log', '{}')", [other])
            inserted = "stored"
        except psycopg.errors.InsufficientPrivilege:
            inserted = "refused"
    return f"update matched {updated} row(s), insert {inserted}"


# ------------------------------------------------------------------ a run


def run_candidate(args: argparse.Namespace, mode: str, hosts: list[tuple[str, str, int]],
                  url: str, roles: list[str]) -> dict[str, Any]:
    from bench import _loadkit

    children = []
    for i, (_name, credential, pk) in enumerate(hosts):
        argv = [sys.executable, __file__, "--child", "ingest" if mode == "ingest" else "direct",
                "--host", str(i + 1), "--deployment", str(pk), "--url", url,
                "--credential", credential, "--role", roles[i] if mode == "direct-rls" else "",
                *_passed(args)]
        children.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, cwd=ROOT))
    backends: list[int] = []
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line.startswith("{"):
            backends.append(json.loads(line)["backend"])
            line = child.stdout.readline().strip()
        if line != "connected":
            raise SystemExit(f"a host did not start ({mode}): {line}")
    if mode == "ingest":
        backends = _panel_backends(args)
    parts = {"panel": _panel_pids() if mode == "ingest" else [],
             "postgres": backends, "hosts": [c.pid for c in children], "redis": _redis_pids()}
    before = {name: _loadkit.cpu_seconds(pids) for name, pids in parts.items()}
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    results = []
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if not line.startswith("{"):
            raise SystemExit(f"a host failed ({mode}): {line}")
        results.append(json.loads(line))
    time.sleep(0.5)  # the last live publishes
    after = {name: _loadkit.cpu_seconds(pids) for name, pids in parts.items()}
    for child in children:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    lines = sum(r["lines"] for r in results)
    cpu = {f"cpu_ms_per_1k_lines_{name}": (after[name] - before[name]) / lines * 1e6
           for name in parts if parts[name]}
    return {"hosts": results, "stored": [_stored(pk, r["lines"]) for (_, _, pk), r in
                                         zip(hosts, results, strict=True)], **cpu}


def _passed(args: argparse.Namespace) -> list[str]:
    return ["--database-url", args.database_url, "--redis-url", args.redis_url,
            "--rate", str(args.rate), "--seconds", str(args.seconds),
            "--batch-ms", str(args.batch_ms), "--batch-lines", str(args.batch_lines)]


def _panel_pids() -> list[int]:
    """The uvicorn this process started and its worker processes."""
    me = os.getpid()
    procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    found = {int(p.name) for p in procs if _ppid(p) == me and b"uvicorn" in _cmdline(p)}
    found |= {int(p.name) for p in procs if _ppid(p) in found}
    return sorted(found)


def _redis_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and _cmdline(p).startswith(b"redis-server")]


def _ppid(p: Path) -> int:
    try:
        return int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""


def _panel_backends(args: argparse.Namespace) -> list[int]:
    from bench import _loadkit

    pg = _loadkit.PgConnections(args)
    rows = pg.conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                           [_loadkit.PANEL_APP_NAME]).fetchall()
    pg.close()
    return [row[0] for row in rows]


def _stored(pk: int, n: int) -> dict[str, Any]:
    """Lines in the database (lost, duplicated) and whether the live stream has the last."""
    import redis
    from django.conf import settings
    from django.db import connection

    from web.deployments import live
    from web.deployments.models import Deployment

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT payload->>'text') FROM deployments_event "
                       "WHERE deployment_id = %s AND kind = 'log' AND payload->>'text' LIKE "
                       "'[%%Decode batch%%'", [pk])
        rows, distinct = cursor.fetchone()
    last_seq = Deployment.objects.values_list("last_seq", flat=True).get(pk=pk)
    newest = redis.Redis.from_url(settings.REDIS_URL).xrevrange(live.stream_key(pk), count=1)
    live_last = live.seq_of(newest[0][0]) if newest else 0
    return {"lost": n - distinct, "duplicated": rows - distinct,
            "live_has_last": live_last == last_seq, "live_behind": last_seq - live_last}


def _cleanup(hosts: list[tuple[str, str, int]]) -> None:
    import redis
    from django.conf import settings

    from web.deployments import live
    from web.deployments.models import Deployment, Event

    client = redis.Redis.from_url(settings.REDIS_URL)
    for _, _, pk in hosts:
        Event.objects.filter(deployment_id=pk).delete()
        Deployment.objects.filter(pk=pk).update(last_seq=0)
        client.delete(live.stream_key(pk))


def show(mode: str, got: dict[str, Any]) -> None:
    for (name, r), s in zip(zip(HOSTS, got["hosts"], strict=True), got["stored"], strict=True):
        print(f"  {mode:10s} {name}: {r['lines_per_s']:8.0f} lines/s stored "
              f"({r['lines']} lines, {r['batches']} batches), batch p50 "
              f"{r['batch_p50_ms']:.1f} ms p99 {r['batch_p99_ms']:.1f} ms max "
              f"{r['batch_max_ms']:.1f} ms, behind at most {r['max_behind_s']:.2f} s; "
              f"lost {s['lost']} duplicated {s['duplicated']}, live stream has the last "
              f"event: {s['live_has_last']} ({s['live_behind']} events behind)")
    cpu = ", ".join(f"{k.removeprefix('cpu_ms_per_1k_lines_')} {v:.1f}"
                    for k, v in got.items() if k.startswith("cpu_"))
    print(f"  {mode:10s} CPU ms per 1,000 lines: {cpu}", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    from bench import _loadkit

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _loadkit.add_common_args(parser)
    parser.add_argument("--rate", type=float, default=10000.0, help="decode lines/s per host")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch-ms", type=float, default=50.0,
                        help="a host's batch interval (the follower's batch_s)")
    parser.add_argument("--batch-lines", type=int, default=2000,
                        help="lines per batch at most (the follower's batch_lines)")
    parser.add_argument("--candidates", default="ingest,direct,direct-rls")
    parser.add_argument("--web-workers", type=int, default=min(os.cpu_count() or 1, 4),
                        help="the panel's server processes (default: as the panel image "
                             "starts it, one per core up to 4)")
    parser.add_argument("--agent-encode", action="store_true",
                        help="only the host agent's CPU per line to batch and encode")
    parser.add_argument("--lines", type=int, default=20000,
                        help="--agent-encode: decode lines made")
    parser.add_argument("--repeats", type=int, default=5, help="--agent-encode: runs")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--host", default="", help=argparse.SUPPRESS)
    parser.add_argument("--deployment", default="", help=argparse.SUPPRESS)
    parser.add_argument("--credential", default="", help=argparse.SUPPRESS)
    parser.add_argument("--role", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args(sys.argv[1:])
    if args.child:
        host_main(sys.argv)
        return
    if args.agent_encode:
        agent_encode(args)
        return
    from bench import _loadkit

    _django(args, migrate=True)
    args.server_env.append(f"WEB_CONCURRENCY={args.web_workers}")  # uvicorn's --workers
    print("command:", _loadkit.command_line())
    print("panel server processes:", args.web_workers)
    print(f"cores: {os.cpu_count()} (panel, PostgreSQL, Redis and the three hosts all on "
          "this machine)")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    hosts = make_hosts()
    roles: list[str] = []
    candidates = [c for c in args.candidates.split(",") if c]
    try:
        if "direct-rls" in candidates:
            roles = rls_setup([name for name, _, _ in hosts])
            print("rls check (host 1's role on host 2's deployment):",
                  rls_refuses_another_hosts_row(args, roles[0], hosts[1][2]))
        with _loadkit.panel(args, Path("/tmp/fleet-transport-panel.log")) as url:
            for mode in candidates:
                got = run_candidate(args, mode, hosts, url, roles)
                show(mode, got)
                _cleanup(hosts)
    finally:
        if roles:
            rls_teardown(roles)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print("shortcuts: one machine of", os.cpu_count(), "cores shared with other work runs "
          "the panel, PostgreSQL, Redis and the three hosts; loopback without TLS; lines "
          "made in memory (no Docker); the RLS roles exist on the bench database only.")


if __name__ == "__main__":
    main()
