"""The log path, engine line to stored event and to an SSE client: latency at a steady rate,
and the sustained rate, compared with `docker logs -f` reading the same container.

A container on the local base image prints numbered lines, each carrying the time it
was printed. The engine agent's real follower (appliance.runtime.follower) with the real
database sink (web/deployments/services/agent.py) follows it into PostgreSQL, exactly as
in production; a panel started like the image's (uvicorn) streams the events to an SSE
client. Figures: lines stored per second, latency from print to commit (p50, p99; the
event row's insert time) and from print to the SSE client's receipt, lost, duplicated
and reordered lines, and the same container read by `docker logs -f` for the ratio.

    .venv/bin/python bench/log_path.py \
        --database-url postgres://appliance@127.0.0.1:5440/appliance_logbench \
        --rate 1000 --seconds 10 --flood 200000
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRINTER = r"""
import sys, time
n, rate = int(sys.argv[1]), float(sys.argv[2])
out = sys.stdout
start = time.time()
for i in range(n):
    if rate > 0:
        due = start + i / rate
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
    out.write(f"line seq={i} t={time.time_ns()}\n")
    if rate > 0 or i % 1000 == 999:
        out.flush()
out.flush()
time.sleep(1)
"""


class SseClient(threading.Thread):
    """Reads the deployment's event stream as a browser does; notes when each line came."""

    def __init__(self, url: str, cookie: str, pk: int) -> None:
        super().__init__(daemon=True)
        self.url, self.cookie, self.pk = url, cookie, pk
        self.latencies_ms: list[float] = []
        self.seqs: list[int] = []
        self.connected = threading.Event()

    def run(self) -> None:
        import json

        import requests

        with requests.get(f"{self.url}/deployments/{self.pk}/events/stream/", stream=True,
                          headers={"Cookie": self.cookie}, timeout=120) as response:
            self.connected.set()
            for raw in response.iter_lines(decode_unicode=True):
                if not raw.startswith("data: "):
                    continue
                event = json.loads(raw[6:])
                text = (event.get("payload") or {}).get("text", "")
                if event["kind"] == "log" and text.startswith("line seq="):
                    printed = int(text.split()[2].split("=")[1]) / 1e9
                    self.latencies_ms.append((time.time() - printed) * 1000)
                    self.seqs.append(int(text.split()[1].split("=")[1]))
                if event["kind"] == "end":
                    return


def follow_run(image: str, n: int, rate: float, panel_url: str = "",
               cookie: str = "") -> dict[str, float]:
    """Start the printer as a deployment's engine and follow it with the agent's follower."""
    from appliance.runtime.containers import ContainerPlan, EngineRuntime
    from appliance.runtime.follower import EngineFollower, FollowOptions, follow
    from web.deployments.models import Deployment
    from web.deployments.services.agent import EngineAgent, _FollowSink

    agent = EngineAgent(agent_id="bench-agent")
    deployment = Deployment.objects.create(
        name="log-bench", spec={}, recipe="bench", algorithm="NONE", gpus=[], status="starting",
        image=image, start_token=f"bench{time.time_ns()}", agent_id=agent.agent_id)
    plan = ContainerPlan(deployment_id=str(deployment.pk), image=image,
                         argv=["python3", "-c", PRINTER, str(n), str(rate)],
                         instance_id="bench", start_token=deployment.start_token)
    client = None
    if panel_url:
        client = SseClient(panel_url, cookie, deployment.pk)
        client.start()
        client.connected.wait(10)
    sink = _FollowSink(deployment, agent, threading.Event())
    sink.identity = plan.identity
    agent.remove_engine = lambda identity: None  # type: ignore[method-assign] # keep it
    follower = EngineFollower(EngineRuntime(), plan, sink, status="starting",
                              options=FollowOptions(partials=False, ready_timeout_s=3600))
    started = time.time()
    follow(follower)
    container = EngineRuntime().find(plan.identity)
    figures = _figures(deployment.pk, n, started)
    if client is not None:
        client.join(timeout=60)
        figures["sse_received"] = len(client.seqs)
        figures["sse_lost"] = n - len(set(client.seqs))
        figures["sse_reordered"] = sum(1 for a, b in zip(client.seqs, client.seqs[1:],
                                                          strict=False) if b < a)
        figures["sse_latency_p50_ms"] = statistics.median(client.latencies_ms)
        figures["sse_latency_p99_ms"] = _p99(client.latencies_ms)
    figures["docker_logs_f_lines_per_s"] = _docker_logs_rate(container.id, n)
    container.remove(force=True)
    deployment.delete()
    return figures


def _figures(pk: int, n: int, started: float) -> dict[str, float]:
    from web.deployments.models import Event

    rows = list(Event.objects.filter(deployment_id=pk, kind="log").order_by("seq")
                .values_list("payload", "ts"))
    seqs, latencies, first_t = [], [], None
    for payload, ts in rows:
        text = payload.get("text", "")
        if not text.startswith("line seq="):
            continue
        seq_part, t_part = text.split()[1:3]
        seqs.append(int(seq_part.split("=")[1]))
        printed = int(t_part.split("=")[1]) / 1e9
        first_t = printed if first_t is None else first_t
        latencies.append((ts.timestamp() - printed) * 1000)
    last_commit = rows[-1][1].timestamp() if rows else started
    stored = len(seqs)
    return {
        "lines": n, "stored": stored, "lost": n - len(set(seqs)),
        "duplicated": stored - len(set(seqs)),
        "reordered": sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b < a),
        "stored_lines_per_s": stored / max(1e-6, last_commit - (first_t or started)),
        "latency_p50_ms": statistics.median(latencies) if latencies else float("nan"),
        "latency_p99_ms": _p99(latencies),
    }


def _p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _docker_logs_rate(container_id: str, n: int) -> float:
    """`docker logs -f` reading the whole (finished) container's output: lines per second."""
    t0 = time.monotonic()
    out = subprocess.run(["docker", "logs", "-f", container_id], capture_output=True, check=True)
    took = time.monotonic() - t0
    count = out.stdout.count(b"\n") + out.stderr.count(b"\n")
    return count / took if count >= n else float("nan")


def main() -> None:
    from bench import _loadkit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _loadkit.add_common_args(parser)
    parser.add_argument("--image", default="appliance-base:bookworm")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--flood", type=int, default=200_000, help="lines printed unpaced")
    args = parser.parse_args()
    _loadkit.setup_django(args)
    print("command:", _loadkit.command_line())
    _loadkit.bench_user()
    with _loadkit.panel(args, Path("/tmp/log-path-panel.log")) as url:
        cookie = _loadkit.login_cookie(url)
        steady = follow_run(args.image, int(args.rate * args.seconds), args.rate, url, cookie)
        print(f"steady {args.rate:.0f} lines/s for {args.seconds:.0f} s:", _fmt(steady))
        flood = follow_run(args.image, args.flood, 0, url, cookie)
        print(f"flood {args.flood} lines unpaced:", _fmt(flood))
    ratio = flood["stored_lines_per_s"] / flood["docker_logs_f_lines_per_s"]
    print(f"sustained store rate / docker logs rate on the same container: {ratio:.2f}")


def _fmt(figures: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in figures.items())


if __name__ == "__main__":
    main()
