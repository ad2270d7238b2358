"""The panel's CPU per request of the host API's ingest, for one or more checkouts'
panels in turn (docs/performance.md, "Log path through the host API").

For each `LABEL:CHECKOUT[:NAME=VALUE...]` a panel is started from that checkout as the
image starts it (uvicorn web.asgi:application, one process; the NAME=VALUE pairs are its
extra environment), a host joins it, a deployment is placed on that host, and --requests
batches of --lines decode lines (two events each, as appliance.runtime.follower makes
them, encoded as RemoteSink encodes them) are POSTed one after another, each following the
cursor the last one left. Figures per panel: its process's CPU per request and per line
(from /proc), each request's wall time (p50, p99) and the requests a second. The
checkouts alternate for --rounds rounds, so load from elsewhere falls on each alike.

    .venv/bin/python bench/ingest_cost.py \\
        --database-url postgres://appliance@127.0.0.1:5440/appliance_logbench \\
        --redis-url redis://127.0.0.1:6390/15 \\
        before:/tmp/before after:. django:.:APPLIANCE_HOST_INGEST_BEFORE_DJANGO=0
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LINE = ("[2026-12-01 09:27:25 TP0] Decode batch, #running-req: 1, #token: {i}, token "
        "usage: 0.00, accept len: 1.23, accept rate: 0.03, cuda graph: True, gen "
        "throughput (token/s): 165.82, #queue-req: 0")
REPORT = {"agent_version": "bench", "gpu_count": 1,
          "docker": {"server_version": "26.1.5", "runtimes": ["runc"], "nvidia": False,
                     "cdi_devices": []}, "secret_names": []}
WARMUP = 50


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def encoded_events(lines: int) -> list[str]:
    from appliance.runtime.follower import EngineFollower
    from appliance.runtime.logstream import lines_of
    from appliance.runtime.panel_link import event_json

    frames = [(1, f"2026-12-01T09:27:25.{i:09d}Z {LINE.format(i=i)}\n".encode())
              for i in range(lines)]
    sink = type("Sink", (), {"advance": lambda self, status: False})()
    follower = EngineFollower(None, None, sink)  # type: ignore[arg-type]
    events = follower._events_for(list(lines_of(iter(frames), False, True)))
    return [event_json(kind, payload) for kind, payload in events]


def measure(url: str, encoded: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from appliance.runtime.panel_link import PanelLink, events_body, panel_join
    from web.deployments.models import Deployment
    from web.fleet import services as fleet
    from web.fleet.models import Placement

    port = url.rsplit(":", 1)[1]
    pid = int(subprocess.run(["pgrep", "-f", "--", f"--port {port}"], capture_output=True,
                             text=True, check=True).stdout.split()[0])
    name = f"ingest-cost-{secrets.token_hex(3)}"
    joined = panel_join(panel_url=url, token=fleet.jointoken_create(host_name=name).secret,
                        name=name, report=REPORT)
    link = PanelLink(url, str(joined["credential"]))
    deployment = Deployment.objects.create(
        name="ingest-cost", spec={"name": "ingest-cost", "recipe": "bench", "gpus": [0],
                                  "engine": {"model_path": "/models/bench"}},
        recipe="bench", algorithm="NONE", gpus=[], status="ready", image="bench",
        start_token=secrets.token_hex(4))
    Placement.objects.filter(deployment=deployment).delete()
    fleet.placement_assign(deployment=deployment, host_name=name, reason="ingest cost")
    link.me()
    cursor = {"after": ""}

    def post(i: int) -> None:
        moved = f"bench-{i}"
        body = events_body(encoded, row={"log_cursor": moved},
                           start_token=deployment.start_token, after=cursor["after"])
        answer = link.ship_body(deployment.pk, body)
        assert answer["stored"], answer
        cursor["after"] = moved

    for i in range(WARMUP):
        post(i)
    walls: list[float] = []
    cpu0, start = cpu_s(pid), time.monotonic()
    for i in range(WARMUP, WARMUP + args.requests):
        began = time.monotonic()
        post(i)
        walls.append((time.monotonic() - began) * 1e3)
    took = time.monotonic() - start
    cpu_ms = (cpu_s(pid) - cpu0) / args.requests * 1e3
    walls.sort()
    return {"panel_cpu_ms_per_request": round(cpu_ms, 2),
            "panel_cpu_us_per_line": round(cpu_ms * 1e3 / args.lines, 1),
            "wall_p50_ms": round(statistics.median(walls), 2),
            "wall_p99_ms": round(walls[int(0.99 * len(walls))], 2),
            "requests_per_s": round(args.requests / took, 1)}


def main() -> None:
    from bench import _loadkit

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _loadkit.add_common_args(parser)
    parser.add_argument("--lines", type=int, default=50, help="decode lines a request")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("panels", nargs="+", metavar="LABEL:CHECKOUT[:NAME=VALUE...]")
    args = parser.parse_args()
    _loadkit.setup_django(args)
    print("command:", _loadkit.command_line())
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    encoded = encoded_events(args.lines)
    for round_ in range(args.rounds):
        for panel in args.panels:
            label, checkout, *env = panel.split(":")
            args.app_dir, args.server_env = Path(checkout).resolve(), env
            with _loadkit.panel(args, Path("/tmp/ingest-cost-panel.log")) as url:
                figures = measure(url, encoded, args)
            print(f"round {round_} {label}: {json.dumps(figures)}", flush=True)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
