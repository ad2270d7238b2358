"""The log path, engine line to stored event and to an SSE viewer, beside `docker logs -f`
reading the same container and PostgreSQL's own COPY of the same rows (docs/performance.md,
Log path).

A container on the local base image prints numbered lines, each carrying the time it was
printed: SGLang decode lines (`[date time.micros TP0] Decode batch, ..., #token: <n>,
...`, each stored as a log event and a metric, as a serving engine's) or plain lines
(`line seq=<n> t=<ns>`, one event each). The host agent's real follower
(appliance.runtime.follower) with its real sink (appliance/runtime/host_sink.py
RemoteSink: each batch through the panel's host API, whose ingest checks the host's lease
and stores the events, cursor and progress in one statement and publishes after commit)
follows it, in this process as in the agent's; a panel started like the image's (uvicorn)
takes the batches and streams the events to an SSE viewer in another process; a third
process reads the same container with `docker logs -f` in the 1,000 lines/s phases, and
for the sustained and plain phases a twin container (the same printer at the same rate) in
a phase of its own right after (`--reference alongside`: the same container at the same
time, where dockerd serves two followers).

Phases: 1,000 decode lines/s before ready (the follower polling /health, as while an
engine loads) and after ready; the sustained rate of decode lines; plain lines unpaced.
Figures per phase: lines stored, lost, duplicated, reordered (in the database and at the
viewer); print-to-commit and print-to-viewer latency (p50, p99, max; "commit" is the row's
ts, taken just before its COPY, so it reads a little early); how far behind the store was
at the end; the same container's `docker logs -f` rate and latency; the agent process's
CPU. After the sustained phase, the stored rows are COPYed again by psycopg alone (same
table layout with its indexes, the agent's batch size, a commit per batch): the database's
own rate on this machine, beside the agent's.

    .venv/bin/python bench/log_path.py \\
        --database-url postgres://appliance@127.0.0.1:5440/appliance_logbench \\
        --redis-url redis://127.0.0.1:6390/15 --rate 10000 --seconds 60

--profile DIR writes py-spy raw profiles of this process (the agent's threads) per phase.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRINTER = r"""
import sys, time
n, rate, shape = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
out = sys.stdout
def lines(first, last, t):
    if shape == "decode":
        head = (time.strftime("[%Y-%m-%d %H:%M:%S", time.gmtime(t))
                + f".{int(t * 1e6) % 1000000:06d} TP0] Decode batch, #running-req: 3, #token: ")
        return "".join(f"{head}{i}, token usage: 0.05, accept len: 3.21, accept rate: 0.40, "
                       "cuda graph: True, gen throughput (token/s): 512.30, #queue-req: 0\n"
                       for i in range(first, last))
    return "".join(f"line seq={i} t={int(t * 1e9)}\n" for i in range(first, last))
time.sleep(1.5)  # the viewer and `docker logs -f` attach first
start, i = time.time(), 0
while i < n:
    now = time.time()
    due = n if rate <= 0 else min(n, int((now - start) * rate) + 1)
    if due <= i:
        time.sleep(max(0.0, start + i / rate - now))
        continue
    due = min(due, i + 1000)
    out.write(lines(i, due, time.time()))
    out.flush()
    i = due
time.sleep(1)
"""

_SECONDS: dict[str, float] = {}


def printed_at(text: str) -> tuple[int, float] | None:
    """(number, Unix time printed) of a printer's line, or None for any other text."""
    if text.startswith("line seq="):
        _, seq, stamp = text.split(" ", 2)
        return int(seq[4:]), int(stamp[2:]) / 1e9
    if text.startswith("[") and "Decode batch" in text:
        whole = text[1:20]
        base = _SECONDS.get(whole)
        if base is None:
            base = _SECONDS[whole] = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
        number = int(text.split("#token: ", 1)[1].split(",", 1)[0])
        return number, base + int(text[21:27]) / 1e6
    return None


def order_figures(prefix: str, seqs: list[int], n: int) -> dict[str, float]:
    unique = set(seqs)
    return {f"{prefix}lost": n - len(unique & set(range(n))),
            f"{prefix}duplicated": len(seqs) - len(unique),
            f"{prefix}reordered": sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b < a)}


def latency_figures(prefix: str, latencies_ms: list[float]) -> dict[str, float]:
    if not latencies_ms:
        return {f"{prefix}p50_ms": float("nan"), f"{prefix}p99_ms": float("nan")}
    ordered = sorted(latencies_ms)
    return {f"{prefix}p50_ms": statistics.median(ordered),
            f"{prefix}p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            f"{prefix}max_ms": ordered[-1]}


# ------------------------------------------------------------------ the other processes


def sse_viewer(url: str, cookie: str, pk: int, n: int) -> None:
    """A viewer in its own process (as a browser is): reads the stream until `end`."""
    import http.client
    from urllib.parse import urlparse

    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=120)
    conn.request("GET", f"/deployments/{pk}/events/stream/", headers={"Cookie": cookie})
    response = conn.getresponse()
    print("connected", flush=True)
    seqs, latencies, metrics, skipped, behind, buffer = [], [], 0, 0, 0, b""
    while True:
        data = response.read1(1 << 16)
        if not data:
            break
        now = time.time()
        buffer += data
        *frames, buffer = buffer.split(b"\n\n")
        ended = False
        for frame in frames:
            start = frame.find(b"data: ")
            if start < 0:
                continue
            kind, text = _frame_kind_and_text(frame, start + 6)
            event: dict[str, Any] = {}
            if not kind:
                event = json.loads(frame[start + 6:])
                kind = event["kind"]
                text = (event.get("payload") or {}).get("text", "") if kind == "log" else ""
            if kind == "metric":
                metrics += 1
            elif kind == "log":
                found = printed_at(text)
                if found is not None:
                    seqs.append(found[0])
                    latencies.append((now - found[1]) * 1000)
            elif kind == "skip":  # the panel skipped this viewer ahead (too far behind)
                skipped += event["payload"]["skipped"]
            elif kind == "behind":  # fell behind the panel's ring: caught up from the record
                behind += 1
            elif kind == "end":
                ended = True
        if ended:
            break
    figures = {"sse_received": len(seqs), "sse_metrics": metrics, "sse_skipped_events": skipped,
               "sse_told_behind": behind,
               **order_figures("sse_", seqs, n), **latency_figures("sse_latency_", latencies)}
    print(json.dumps(figures), flush=True)


_KIND = b',"kind":"'
_LOG_TEXT = b'"payload":{"stream":"stdout","text":"'


def _frame_kind_and_text(frame: bytes, start: int) -> tuple[str, str]:
    """The kind of an event frame (the panel's JSON: seq, ts, kind, payload in that order)
    and a log event's text, without decoding the whole frame: at 20,000 events/s json.loads
    made the viewer the costliest process beside the panel (0.12 of a core). Anything else
    comes back with kind "" (the caller decodes it)."""
    at = frame.find(_KIND, start, start + 80)
    if at < 0:
        return "", ""
    if frame.startswith(b'metric"', at + len(_KIND)):
        return "metric", ""
    if not frame.startswith(b'log",', at + len(_KIND)):
        return "", ""
    text_at = frame.find(_LOG_TEXT, at)
    if text_at < 0 or not frame.endswith(b'"}}'):
        return "", ""
    raw = frame[text_at + len(_LOG_TEXT):-3]
    if b"\\" in raw:
        return "log", json.loads(b'"' + raw + b'"')
    return "log", raw.decode()


def docker_watcher(container_id: str, n: int) -> None:
    """`docker logs -f` on the engine's container, read as it comes: its rate and latency."""
    proc = subprocess.Popen(["docker", "logs", "-f", container_id], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    print("connected", flush=True)
    seqs, latencies, first, last = [], [], 0.0, 0.0
    for raw in proc.stdout:
        now = time.time()
        found = printed_at(raw.decode(errors="replace").rstrip("\n"))
        if found is None:
            continue
        first = first or now
        last = now
        seqs.append(found[0])
        latencies.append((now - found[1]) * 1000)
    proc.wait()
    figures = {"docker_logs_f_lines": len(seqs),
               "docker_logs_f_lines_per_s": len(seqs) / max(1e-6, last - first),
               **latency_figures("docker_logs_f_latency_", latencies)}
    print(json.dumps(figures), flush=True)


def _child(*argv: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "connected":
        raise SystemExit(f"{argv[0]} did not start")
    return proc


def _child_figures(proc: subprocess.Popen[str] | None, limit_s: float) -> dict[str, Any]:
    if proc is None:
        return {}
    try:
        out, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    lines = [line for line in (out or "").splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"child_failed": 1}


# ------------------------------------------------------------------ where the CPU went


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pids(match: Any) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if match(int(entry.name), ppid, cmd):
                found.append(int(entry.name))
    return found


class CpuShares:
    """CPU seconds per part of the path over a phase, as shares of one core: this process
    (the agent's follower), the panel (uvicorn), PostgreSQL's backends on this database
    (a session opened during the phase is missed), dockerd and Redis (shared with anything
    else using them), the viewer and `docker logs -f` (without its CLI)."""

    def __init__(self, children: dict[str, int]) -> None:
        me = os.getpid()
        self.parts: dict[str, list[int]] = {
            "agent": [me], **{name: [pid] for name, pid in children.items()},
            "panel": _pids(lambda pid, ppid, cmd: ppid == me and "uvicorn" in cmd),
            "dockerd": _pids(lambda pid, ppid, cmd: cmd.startswith(("dockerd", "/usr/sbin/dockerd",
                                                                    "/usr/bin/dockerd"))),
            "redis": _pids(lambda pid, ppid, cmd: cmd.startswith("redis-server")),
        }
        self.start = self._now()
        self.t0 = time.monotonic()

    def add_postgres(self) -> None:
        """PostgreSQL's backends on this database (found at the end: they are pooled)."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            self.parts["postgres"] = [row[0] for row in cursor.fetchall()]
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        return {name: sum(_cpu_s(pid) for pid in pids) for name, pids in self.parts.items()}

    def shares(self, lines: int) -> dict[str, float]:
        """Each part's share of a core, and the path's CPU microseconds per line."""
        wall = time.monotonic() - self.t0
        now = self._now()
        used = {name: now[name] - self.start.get(name, 0.0) for name in now}
        return {**{f"cpu_{name}": seconds / wall for name, seconds in used.items()},
                "cpu_agent_us_per_line": used["agent"] / max(1, lines) * 1e6,
                "cpu_path_us_per_line": sum(used.values()) / max(1, lines) * 1e6}


class ThreadCpu(threading.Thread):
    """CPU seconds per thread name of this process (the agent's reader, follower, shipper,
    publisher), sampled from /proc every half second so a thread that ends is still counted
    (up to its last half second)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="bench-thread-cpu")
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, float] = {}
        self.done = threading.Event()
        self._sample()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self._sample()

    def _sample(self) -> None:
        names = {thread.native_id: thread.name for thread in threading.enumerate()}
        for task in Path("/proc/self/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            tid = int(task.name)
            name = names.get(tid) or stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            self.first.setdefault(tid, (name, seconds))
            self.last[tid] = seconds

    def per_line_us(self, lines: int) -> dict[str, float]:
        self._sample()
        self.done.set()
        used: dict[str, float] = {}
        for tid, (name, first) in self.first.items():
            label = {"MainThread": "follower"}.get(name, name).replace("engine-log-", "")
            used[label] = used.get(label, 0.0) + self.last[tid] - first
        return {f"agent_thread_us_per_line_{name}": seconds / max(1, lines) * 1e6
                for name, seconds in used.items() if seconds > 0}


# ------------------------------------------------------------------ one followed engine


def follow_run(args: argparse.Namespace, *, shape: str, n: int, rate: float, ready: bool,
               panel_url: str, cookie: str, profile: str = "",
               reference_apart: bool = False) -> dict[str, Any]:
    """Print n lines from a container followed as the agent follows a deployment's engine.

    `docker logs -f` reads the same container alongside, or (reference_apart) a twin of it
    (the same printer at the same rate) in a phase of its own right after: alongside, dockerd
    serves two followers and the CLI and its reader take about a quarter of a core at
    10,000 lines/s, CPU the path then does not have (measured)."""
    from appliance.runtime.container_plan import ContainerPlan
    from appliance.runtime.containers import EngineRuntime
    from appliance.runtime.follow_threads import FollowOptions
    from appliance.runtime.follower import EngineFollower, follow
    from web.deployments.models import Deployment

    status = "ready" if ready else "starting"
    # A host's placements carry the spec, so it must be one the panel reads.
    spec = {"name": f"log-bench-{shape}", "recipe": "bench", "gpus": [0],
            "engine": {"model_path": "/models/bench"}}
    deployment = Deployment.objects.create(
        name=f"log-bench-{shape}", spec=spec, recipe="bench", algorithm="NONE", gpus=[],
        status=status, image=args.image, start_token=secrets.token_hex(4),
        agent_id=f"agent@{API_HOST}")
    plan = ContainerPlan(deployment_id=str(deployment.pk), image=args.image,
                         argv=["python3", "-c", PRINTER, str(n), str(rate), shape],
                         instance_id="bench", start_token=deployment.start_token)
    from web.deployments import live

    live.forget(deployment.pk)  # a stream left by an earlier database's deployment of this pk
    viewer = _child("--sse-viewer", panel_url, cookie, str(deployment.pk), str(n))
    runtime = EngineRuntime()
    # The host joins (the first phase) and reads its placements before the printer starts,
    # as an agent joins once at its start and never while an engine prints: in the phase,
    # the panel's first join (its token check, a fresh panel's first requests) held the
    # follower for 1.6 s of the first 10,000 lines, and their p99 with it.
    sink = api_sink(panel_url, deployment, runtime, plan.identity)
    container = runtime.ensure_started(plan)
    watcher = None if reference_apart else _child("--docker-watcher", container.id, str(n))
    batches: list[int] = []
    ship = sink.ship_encoded  # the shipper's write; the follower encodes (sink.encode)
    timing = {"wall": 0.0, "cpu": 0.0}
    # Time spent runnable but waiting for a CPU during the ships (/proc schedstat): the
    # shipper's thread (the panel's sessions store: counted as PostgreSQL).
    waits = {"ship_thread": 0.0}

    def counted(shipments: Any, cursor: Any) -> None:
        batches.append(sum(len(shipment.followed) for shipment in shipments))
        stats = {"ship_thread": f"/proc/self/task/{threading.get_native_id()}/schedstat"}
        before = {who: _runq_wait_s(path) for who, path in stats.items()}
        wall, cpu = time.monotonic(), time.thread_time()
        ship(shipments, cursor)
        timing["wall"] += time.monotonic() - wall
        timing["cpu"] += time.thread_time() - cpu
        for who, path in stats.items():
            waits[who] += _runq_wait_s(path) - before[who]

    sink.ship_encoded = counted  # type: ignore[method-assign]
    # As the agent follows a fresh start: the bar's attach stream is read until the engine is
    # ready, not after (appliance/runtime/follower.py).
    follower = EngineFollower(runtime, plan, sink, status=status, may_start=False,
                              options=FollowOptions(partials=not ready, ready_timeout_s=3600))
    spy = _profile(profile)
    container.reload()
    shares = CpuShares({"viewer": viewer.pid, **({"watcher": watcher.pid} if watcher else {})})
    shares.add_postgres()  # the panel's and this process's sessions (pooled: kept open)
    threads = ThreadCpu()
    threads.start()
    follow(follower)
    cpu_shares = {**shares.shares(n), **threads.per_line_us(n)}
    if spy is not None:
        spy.send_signal(2)
        spy.wait(30)
    figures: dict[str, Any] = {"shape": shape, "lines": n, "offered_per_s": rate or "unpaced"}
    figures.update(_stored(deployment.pk, n, shape))
    figures["batches"] = len(batches)
    events_shipped = max(1, sum(batches))
    figures["ship_wall_us_per_event"] = timing["wall"] / events_shipped * 1e6
    figures["ship_cpu_us_per_event"] = timing["cpu"] / events_shipped * 1e6
    for who, seconds in waits.items():
        figures[f"{who}_cpu_wait_us_per_event"] = seconds / events_shipped * 1e6
    # The panel's sessions stored it: in cpu_postgres and cpu_panel, not the shipper's.
    figures["ship_backend_cpu_us_per_event"] = float("nan")
    figures["ship_backend_cpu_wait_us_per_event"] = float("nan")
    figures["events_per_batch"] = statistics.mean(batches) if batches else 0
    figures.update(cpu_shares)
    figures.update(_child_figures(viewer, 120))
    figures["docker_logs_replay_lines_per_s"] = _replay_rate(container.id, n)
    figures["_pk"] = deployment.pk
    figures["_batch_events"] = int(figures["events_per_batch"])
    container.remove(force=True)
    if watcher is not None:
        figures.update(_child_figures(watcher, 60))
        figures["docker_logs_f_phase"] = "alongside"
    else:
        figures.update(reference_run(args, runtime, plan, shape=shape, n=n, rate=rate))
    return figures


API_HOST = "log-bench-host"
_links: dict[str, Any] = {}


def api_sink(panel_url: str, deployment: Any, runtime: Any, identity: Any) -> Any:
    """The follower's sink of a host's agent (appliance.runtime.host_sink.RemoteSink):
    each batch goes through the panel's host API (HTTP to the started panel, its ingest
    storing it), as the one agent of the panel's own host will send it. The host joins
    once per run, with a join token made here; the deployment is placed on it."""
    from appliance.runtime.agent_settings import RemoteSettings
    from appliance.runtime.host_sink import RemoteSink
    from appliance.runtime.panel_link import PanelLink, panel_join
    from appliance.runtime.remote_agent import RemoteAgent, host_report
    from web.fleet import services as fleet
    from web.fleet.models import Placement

    config = RemoteSettings(panel_url=panel_url, host_name=API_HOST, advertise_addr="127.0.0.1",
                            gpu_requests=False, gpu_check=False)
    link = _links.get(panel_url)
    if link is None:
        # The bench's own host: what an interrupted run left placed on it goes first.
        Placement.objects.filter(host__name=API_HOST).delete()
        token = fleet.jointoken_create(host_name=API_HOST).secret
        joined = panel_join(panel_url=panel_url, token=token, name=API_HOST,
                            report=host_report(runtime, config))
        link = _links[panel_url] = PanelLink(panel_url, str(joined["credential"]))
    # Its stop is a no-op: the printer's container is read again after it ended, where a
    # host's agent stops an engine that ended.
    keep = type("KeptRuntime", (), {"stop": lambda self, identity, timeout_s=0: None})()
    agent = RemoteAgent(link=link, config=config, runtime=keep)
    fleet.placement_assign(deployment=deployment, host_name=API_HOST, reason="log bench")
    link.me()  # as the agent's tick: its placements (and the host's writer lease) first
    placement = {"id": deployment.pk, "start_token": deployment.start_token,
                 "status": deployment.status, "progress": {}, "engine_url": ""}
    return RemoteSink(placement, agent, threading.Event(), identity)


def reference_run(args: argparse.Namespace, runtime: Any, plan: Any, *, shape: str, n: int,
                  rate: float) -> dict[str, Any]:
    """`docker logs -f` alone on a twin of the phase's container (the same image, printer,
    shape and rate; at most --reference-seconds of a paced printer, whose rate it only
    confirms): the reference, in its own phase of the same run."""
    from appliance.runtime.container_plan import ContainerPlan

    count = n if rate <= 0 else min(n, int(rate * args.reference_seconds))
    twin = ContainerPlan(deployment_id=f"{plan.deployment_id}-reference", image=plan.image,
                         argv=["python3", "-c", PRINTER, str(count), str(rate), shape],
                         instance_id=plan.instance_id, start_token=plan.start_token)
    container = runtime.ensure_started(twin)
    try:
        watcher = _child("--docker-watcher", container.id, str(count))
        figures = _child_figures(watcher, 60 + count / max(rate, 1000))
    finally:
        container.remove(force=True)
    return {**figures, "docker_logs_f_phase": "own phase, twin container",
            "docker_logs_f_lines_offered": count}


_SCHEDSTATS: dict[str, int] = {}


def _runq_wait_s(schedstat: str) -> float:
    """Seconds a thread or process spent runnable, waiting for a CPU (0 once it is gone).
    The file stays open and is re-read in place: read four times a ship, pathlib's
    read_text was a tenth of the shipper's samples at 1,000 lines/s."""
    try:
        fd = _SCHEDSTATS.get(schedstat)
        if fd is None:
            fd = _SCHEDSTATS[schedstat] = os.open(schedstat, os.O_RDONLY)
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _profile(directory: str) -> subprocess.Popen[bytes] | None:
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    out = Path(directory) / f"agent-{time.strftime('%H%M%S')}.txt"
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(spy), "record", "--pid", str(os.getpid()), "-r", "100",
                             "--threads", "--idle", "-f", "raw", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stored(pk: int, n: int, shape: str) -> dict[str, Any]:
    """Order, loss and latency of the stored lines, from the rows (one SQL read)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT payload->>'text', extract(epoch from ts) FROM deployments_event "
                       "WHERE deployment_id = %s AND kind = 'log' ORDER BY seq", [pk])
        rows = cursor.fetchall()
        cursor.execute("SELECT count(*) FROM deployments_event WHERE deployment_id = %s "
                       "AND kind = 'metric'", [pk])
        metrics = cursor.fetchone()[0]
    seqs, latencies, first_print, last_commit = [], [], None, 0.0
    for text, ts in rows:
        found = printed_at(text or "")
        if found is None:
            continue
        seqs.append(found[0])
        first_print = found[1] if first_print is None else first_print
        last_commit = float(ts)
        latencies.append((float(ts) - found[1]) * 1000)
    stored = len(seqs)
    span = max(1e-6, last_commit - (first_print or last_commit))
    # The rate between commits: the lines the commits after the first stored, over the time
    # from the first commit to the last. The span above also holds the last line's lag, so
    # a path that keeps up reads at most n / (print time + that lag) there.
    commits = [float(ts) for _, ts in rows]
    first_commit = min(commits, default=0.0)
    after_first = sum(1 for ts in commits if ts > first_commit)
    commit_span = max(1e-6, last_commit - first_commit)
    figures = {"stored": stored, "stored_lines_per_s": stored / span,
               "stored_events_per_s": (stored + metrics) / span,
               "commit_lines_per_s": after_first / commit_span,
               **order_figures("", seqs, n), **latency_figures("commit_latency_", latencies)}
    if shape == "decode":
        figures["metric_events"] = metrics
    return figures


def _replay_rate(container_id: str, n: int) -> float:
    """`docker logs` of the finished container (a replay, not a follow): lines per second."""
    t0 = time.monotonic()
    out = subprocess.run(["docker", "logs", container_id], capture_output=True, check=True)
    count = out.stdout.count(b"\n") + out.stderr.count(b"\n")
    return count / (time.monotonic() - t0) if count >= n else float("nan")


def copy_reference(args: argparse.Namespace, pk: int, batch_events: int) -> dict[str, float]:
    """PostgreSQL's own COPY of the stored rows (psycopg alone, no per-row Python) into a
    table like the events table, indexes included, a commit per agent-sized batch."""
    import psycopg

    dsn = args.database_url.replace("postgres://", "postgresql://", 1)
    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cursor, cursor.copy(
                "COPY (SELECT deployment_id, seq, ts, kind, payload FROM deployments_event "
                f"WHERE deployment_id = {int(pk)} ORDER BY seq) TO STDOUT") as copy:
            data = b"".join(bytes(block) for block in copy)
        rows = data.splitlines(keepends=True)
        # A table like the events table: not a temporary one, which skips the WAL.
        conn.execute("DROP TABLE IF EXISTS bench_copy")
        conn.execute("CREATE TABLE bench_copy (LIKE deployments_event INCLUDING ALL)")
        conn.commit()
        size = max(1, batch_events)
        t0 = time.monotonic()
        for start in range(0, len(rows), size):
            with conn.cursor() as cursor, cursor.copy(
                    "COPY bench_copy (deployment_id, seq, ts, kind, payload) FROM STDIN") as copy:
                copy.write(b"".join(rows[start:start + size]))
            conn.commit()
        took = time.monotonic() - t0
        conn.execute("DROP TABLE bench_copy")
        conn.commit()
    return {"copy_rows": len(rows), "copy_batch_rows": size, "copy_rows_per_s": len(rows) / took}


def _cleanup(pk: int) -> None:
    from django.db import connection

    from web.deployments import live

    live.forget(pk)  # the live stream: a later run's deployment may get the same pk
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM deployments_event WHERE deployment_id = %s", [pk])
        # the status reads' stored answers, which the agent's batches now keep
        cursor.execute("DELETE FROM deployments_statusbody WHERE deployment_id = %s", [pk])
        cursor.execute("DELETE FROM fleet_placement WHERE deployment_id = %s", [pk])
        cursor.execute("DELETE FROM deployments_deployment WHERE id = %s", [pk])


# ------------------------------------------------------------------ CPU per stage


STAGE_LINES = 20_000


def stage_costs(root: str, pk: int) -> None:
    """CPU microseconds per decode line in each stage of the agent's path, for the code in
    `root` (another checkout: --compare-with), printed as JSON. Docker's frames are made
    here, the database and Redis are the real ones; the publish is timed on its own."""
    sys.path.insert(0, root)
    os.chdir(root)
    import django

    django.setup()
    from django.db import transaction

    from appliance.runtime.follower import EngineFollower
    from appliance.runtime.logstream import lines_of
    from web.deployments import live
    from web.deployments.services import events as ev

    line = ("[2026-12-01 09:27:25 TP0] Decode batch, #running-req: 1, #token: {i}, token "
            "usage: 0.00, accept len: 1.23, accept rate: 0.03, cuda graph: True, gen "
            "throughput (token/s): 165.82, #queue-req: 0")
    frames = [(1, f"2026-12-01T09:27:{25 + i // 10000:02d}.{i:09d}Z {line.format(i=i)}\n"
               .encode()) for i in range(STAGE_LINES)]
    costs: dict[str, float] = {}

    def cpu(label: str, work: Any) -> Any:
        start = time.process_time()
        result = work()
        costs[label] = (time.process_time() - start) / STAGE_LINES * 1e6
        return result

    cpu("docker_frames_us", lambda: _read_docker_frames(line))
    lines = cpu("split_and_stamp_us", lambda: list(lines_of(iter(frames), False, True)))
    sink = type("Sink", (), {"advance": lambda self, status: False})()
    follower = EngineFollower(None, None, sink)  # type: ignore[arg-type]
    events = cpu("parse_us", lambda: follower._events_for(lines))
    published: list[tuple[str, Any]] = []
    append = getattr(ev, "events_append_batch", ev.events_append)
    if hasattr(live, "publish_entries_later"):
        live.publish_entries_later = lambda pk, w: published.append(  # type: ignore[assignment]
            ("entries", w))
    live.publish_later = lambda pk, w: published.append(("wire", w))  # type: ignore[assignment]

    def store() -> None:
        for start in range(0, len(events), 4000):
            with transaction.atomic():
                append(deployment_id=pk, events=events[start:start + 4000])

    def publish() -> None:
        for how, batch in published:
            (live.publish_entries if how == "entries" else live.publish)(pk, batch)

    cpu("store_us", store)
    cpu("publish_us", publish)
    costs["total_us"] = sum(costs.values())
    print(json.dumps(costs), flush=True)


def _read_docker_frames(line: str) -> int:
    """Docker's stream of a finished container's STAGE_LINES lines, read as frames."""
    import docker
    from appliance.runtime import logstream

    client = docker.from_env()  # type: ignore[attr-defined]
    script = (f"import sys\nfor i in range({STAGE_LINES}): "
              f"sys.stdout.write({line!r}.format(i=i) + '\\n')\n")
    container = client.containers.run("appliance-base:bookworm", ["python3", "-c", script],
                                      detach=True, labels={"appliance.test": "log-bench"})
    try:
        container.wait()
        return sum(1 for _ in logstream.log_frames(client.api, container.id, None, True))
    finally:
        container.remove(force=True)


def compare_stages(args: argparse.Namespace) -> None:
    """The stage costs of this checkout and of --compare-with, alternating, twice."""
    from web.deployments.models import Deployment

    pk = Deployment.objects.create(name="log-bench-stages", spec={}, recipe="bench",
                                   algorithm="NONE", gpus=[], status="ready").pk
    for _ in range(2):
        for label, root in (("before", args.compare_with), ("after", str(ROOT))):
            done = subprocess.run([sys.executable, __file__, "--stage-costs", root, str(pk)],
                                  capture_output=True, text=True, check=True)
            costs = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"stage CPU per decode line, {label} ({root}):", _fmt(costs), flush=True)
    _cleanup(pk)


# ------------------------------------------------------------------ main


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sse-viewer":
        sse_viewer(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--docker-watcher":
        docker_watcher(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--stage-costs":
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
        stage_costs(sys.argv[2], int(sys.argv[3]))
        return
    from bench import _loadkit

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _loadkit.add_common_args(parser)
    parser.add_argument("--image", default="appliance-base:bookworm")
    parser.add_argument("--steady-rate", type=float, default=1000.0)
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=10000.0, help="sustained decode lines/s")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--flood", type=int, default=300_000, help="plain lines unpaced")
    parser.add_argument("--phases", default="before,after,sustained,plain")
    parser.add_argument("--reference", choices=("apart", "alongside"), default="apart",
                        help="`docker logs -f` for the sustained and plain phases: in its "
                             "own phase on a twin container (default), or on the same "
                             "container at the same time (dockerd then serves two followers)")
    parser.add_argument("--reference-seconds", type=float, default=20.0,
                        help="how long the paced twin prints, at the phase's rate")
    parser.add_argument("--profile", default="", help="py-spy raw profiles into this folder")
    parser.add_argument("--road", choices=("api",), default="api",
                        help="api, the one road (compose's agent is the fleet's, on every "
                             "host): a host agent's sink, through the started panel's host API "
                             "(appliance/runtime/remote_agent.py). The database-writing agent "
                             "(web/agent, the `direct` road) is gone; its figures in "
                             "docs/performance.md were measured before it went")
    parser.add_argument("--compare-with", default="", metavar="CHECKOUT",
                        help="also print the CPU per stage of another checkout's code beside "
                             "this one's (e.g. `git archive d964bb5 | tar -x -C /tmp/old`)")
    args = parser.parse_args()
    _loadkit.setup_django(args)
    print("command:", _loadkit.command_line())
    print("road: a host agent's sink (RemoteSink) through the started panel's host API")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    if args.compare_with:
        compare_stages(args)
    _loadkit.bench_user()
    # This process is the phases' agent: its collector as worker/agent.py settles the agent's
    # (the Django it also loads, which the agent does not, frozen with the rest).
    from appliance import collector

    collector.settle()
    phases = [phase for phase in args.phases.split(",") if phase]
    steady_n = int(args.steady_rate * args.steady_seconds)
    plan = {
        "before": dict(shape="decode", n=steady_n, rate=args.steady_rate, ready=False),
        "after": dict(shape="decode", n=steady_n, rate=args.steady_rate, ready=True),
        "sustained": dict(shape="decode", n=int(args.rate * args.seconds), rate=args.rate,
                          ready=True),
        "plain": dict(shape="plain", n=args.flood, rate=0.0, ready=True),
    }
    results: dict[str, dict[str, Any]] = {}
    with _loadkit.panel(args, Path("/tmp/log-path-panel.log")) as url, _printers_removed():
        cookie = _loadkit.login_cookie(url)
        for phase in phases:
            apart = args.reference == "apart" and phase in ("sustained", "plain")
            figures = follow_run(args, **plan[phase], panel_url=url, cookie=cookie,  # type: ignore[arg-type]
                                 profile=args.profile, reference_apart=apart)
            pk, batch = figures.pop("_pk"), figures.pop("_batch_events")
            if phase == "sustained":
                figures.update(copy_reference(args, pk, batch))
                figures["stored_events_per_s_over_copy"] = (
                    figures["stored_events_per_s"] / figures["copy_rows_per_s"])
            if "docker_logs_f_lines_per_s" in figures:
                figures["stored_over_docker_logs_f"] = (
                    figures["stored_lines_per_s"] / figures["docker_logs_f_lines_per_s"])
            print(f"{phase}:", _fmt(figures), flush=True)
            results[phase] = figures
            _cleanup(pk)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print_targets(results, args)


@contextlib.contextmanager
def _printers_removed() -> Iterator[None]:
    """The phases' printer containers (instance `bench`) are removed however the run ends:
    one a failed phase left would read as a stray to the next agent that starts here."""
    try:
        yield
    finally:
        import docker
        from appliance.runtime.container_plan import LABEL_INSTANCE

        client = docker.from_env()  # type: ignore[attr-defined]
        for container in client.containers.list(
                all=True, filters={"label": f"{LABEL_INSTANCE}=bench"}):
            container.remove(force=True)


def print_targets(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """The issue's targets, each beside its figure and its reference from this same run."""
    print("\ntargets (log path): figure | target | reference in this run")
    for phase in ("before", "after"):
        got = results.get(phase)
        if got:
            reference = got.get("docker_logs_f_latency_p99_ms", float("nan"))
            print(f"  {args.steady_rate:,.0f} decode lines/s {phase} ready: print->viewer p99 "
                  f"{_viewer_p99(got)} | < 50 ms | "
                  f"`docker logs -f` p99 {reference:.1f} ms; print->commit p99 "
                  f"{got['commit_latency_p99_ms']:.1f} ms; {_order(got)}")
    got = results.get("sustained")
    if got:
        print(f"  {args.rate:,.0f} decode lines/s for {args.seconds:.0f} s: stored "
              f"{got['stored_events_per_s']:,.0f} events/s ({got['stored_lines_per_s']:,.0f} "
              f"lines/s) | {2 * args.rate:,.0f} events/s | `docker logs -f` ({_where(got)}) "
              f"{got.get('docker_logs_f_lines_per_s', 0):,.0f} lines/s "
              f"({got.get('stored_over_docker_logs_f', float('nan')):.2f}x); PostgreSQL's own "
              f"COPY {got.get('copy_rows_per_s', 0):,.0f} rows/s "
              f"({got.get('stored_events_per_s_over_copy', float('nan')):.2f}x)")
        print(f"    from the first commit to the last {got['commit_lines_per_s']:,.0f} lines/s "
              "(the figure above spans the first print to the last commit: it holds the last "
              "line's lag)")
        print(f"    lag (print->commit) p99 {got['commit_latency_p99_ms'] / 1000:.2f} s, max "
              f"{got['commit_latency_max_ms'] / 1000:.2f} s | < 2 s | viewer p99 "
              f"{_viewer_p99(got)}; {_order(got)}")
    got = results.get("plain")
    if got:
        print(f"  plain lines unpaced: stored {got['stored_lines_per_s']:,.0f} lines/s | 30,000 "
              f"and >= 0.3x | `docker logs -f` ({_where(got)}) "
              f"{got.get('docker_logs_f_lines_per_s', 0):,.0f} "
              f"lines/s ({got.get('stored_over_docker_logs_f', float('nan')):.2f}x); "
              f"{_order(got)}")
    for phase, got in results.items():
        print(f"  CPU {phase}: agent {got['cpu_agent_us_per_line']:.1f} us/line, whole path "
              f"{got['cpu_path_us_per_line']:.1f} us/line (agent {got['cpu_agent']:.2f}, "
              f"panel {got.get('cpu_panel', 0):.2f}, PostgreSQL {got.get('cpu_postgres', 0):.2f}, "
              f"dockerd {got.get('cpu_dockerd', 0):.2f}, Redis {got.get('cpu_redis', 0):.2f}, "
              f"the viewer "
              f"{got.get('cpu_viewer', 0):.2f}, `docker logs -f`'s reader "
              f"{got.get('cpu_watcher', 0):.2f} of a core)")
        threads = {k[len("agent_thread_us_per_line_"):]: v for k, v in got.items()
                   if k.startswith("agent_thread_us_per_line_")}
        print("    the agent's threads, us of CPU per line: " + ", ".join(
            f"{name} {us:.1f}" for name, us in sorted(threads.items(), key=lambda kv: -kv[1])))
        print(f"    the shipper per event: {got['ship_wall_us_per_event']:.1f} us of wall, "
              f"{got['ship_cpu_us_per_event']:.1f} us of its CPU and "
              f"{got['ship_backend_cpu_us_per_event']:.1f} us of PostgreSQL's; waiting for a "
              f"CPU: its thread {got.get('ship_thread_cpu_wait_us_per_event', 0):.1f} us, "
              f"its session {got.get('ship_backend_cpu_wait_us_per_event', 0):.1f} us")


def _viewer_p99(got: dict[str, Any]) -> str:
    """The viewer's p99, or why it is withheld: its process near a full core (then the
    client, not the panel, may have set it)."""
    from bench._loadkit import CLIENT_BOUND_SHARE

    share = got.get("cpu_viewer", 0.0)
    if share >= CLIENT_BOUND_SHARE:
        return f"withheld (the viewer's process used {share:.2f} of a core)"
    return (f"{got.get('sse_latency_p99_ms', float('nan')):.1f} ms (the viewer's process "
            f"{share:.2f} of a core)")


def _where(got: dict[str, Any]) -> str:
    if got.get("docker_logs_f_phase") == "alongside":
        return "same container, same time"
    return (f"own phase: a twin container, {got.get('docker_logs_f_lines_offered', 0):,} "
            "lines at the same rate")


def _order(got: dict[str, Any]) -> str:
    return (f"stored lost/dup/reordered {got['lost']}/{got['duplicated']}/{got['reordered']}, "
            f"viewer {got.get('sse_lost', '?')}/{got.get('sse_duplicated', '?')}/"
            f"{got.get('sse_reordered', '?')} (skipped by the panel "
            f"{got.get('sse_skipped_events', '?')} events, told behind "
            f"{got.get('sse_told_behind', '?')} times)")


def _fmt(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in figures.items())


if __name__ == "__main__":
    main()
