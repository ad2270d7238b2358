"""A fleet through the gateway: throughput of 1, 2 and 4 paced replicas, the gateway's added
TTFB at 4 replicas, failover after an engine is killed, failed requests during a rolling
redeploy; all as ratios and percentiles of one run.

    python bench/fleet.py [--database-url URL] [--redis-url URL] [--tpot-ms 50] [--batch 4]
        [--tokens 16] [--seconds 12] [--ttfb-requests 300] [--skip failover,rolling]

The road: PostgreSQL and Redis (the ones given), the Celery worker, the engine agent and the
panel (`uvicorn web.asgi:application`) as the compose services run them, each a process of
this checkout; the engines are test engine containers (docker/test-engine, a simulator) that
the agent starts from deployments made through the panel's services, paced: a fixed TPOT
(TEST_ENGINE_TOKEN_S) and a batch limit (`--max-running-requests`; more requests wait), so a
replica serves at most batch / TPOT tokens a second.

Shortcuts, said beside every figure the bench prints:
- the panel, worker and agent are processes on this machine, not compose containers, so the
  gateway reaches each engine at its port published on loopback (Docker's port proxy in the
  path) where compose reaches it by name on the engine network;
- replica rows: a spec with `replicas: 4` is made through deployment_create; where that makes
  no replica rows (the replicas code not in this checkout), four deployments are made and
  rows 1-3 are pointed at row 0 with the ORM (`replica_of`, `replica_index`, the same name),
  as the shared decision allows; the bench says which it did;
- 1 and 2 replicas are the 4 with the others set `draining` (out of the gateway's rotation),
  so all levels run on the same engines; the direct path sends to the same N engines in turn.
The direct path is the client calling the engines' published ports itself, spread evenly:
what perfect balancing with no gateway gives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _loadkit  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parent.parent
NAME = "fleet-bench"
OWNER = "fleet-bench"
REPLICAS = 4


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--database-url", default=os.environ.get(
        "APPLIANCE_DATABASE_URL", _loadkit.DEFAULT_DATABASE_URL))
    p.add_argument("--redis-url", default=os.environ.get(
        "APPLIANCE_REDIS_URL", _loadkit.DEFAULT_REDIS_URL))
    p.add_argument("--image", default=os.environ.get("APPLIANCE_TEST_ENGINE_IMAGE",
                                                     "appliance-test-engine:latest"))
    p.add_argument("--tpot-ms", type=float, default=50.0, help="the engines' time per token")
    p.add_argument("--batch", type=int, default=4, help="--max-running-requests of each engine")
    p.add_argument("--tokens", type=int, default=16, help="max_tokens of each request")
    p.add_argument("--seconds", type=float, default=12.0, help="each throughput level's length")
    p.add_argument("--ttfb-requests", type=int, default=300, help="a path, at 4 replicas")
    p.add_argument("--skip", default="", help="comma-separated: throughput,ttfb,failover,rolling")
    return p.parse_args()


# ------------------------------------------------------------------ the stack


@contextlib.contextmanager
def stack(args: argparse.Namespace, logs: Path) -> Iterator[str]:
    """Worker, agent and panel as processes on the given database and Redis; the panel's
    URL. Engines this install started are removed afterwards."""
    import redis

    from tests.servers import celery_worker, engine_agent, panel_server

    redis.Redis.from_url(args.redis_url).flushdb()  # no tasks of an earlier run
    env = {
        "APPLIANCE_REDIS_URL": args.redis_url,
        "APPLIANCE_DEBUG": "0",
        "APPLIANCE_ENGINE_IMAGE": args.image,
        "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
        # TPOT by the engine's environment: a spec's env refuses names like *_TOKEN_S.
        "APPLIANCE_ENGINE_EXTRA_ENV": f"TEST_ENGINE_PACE_S=0.005,TEST_ENGINE_SHARDS=2,"
                                      f"TEST_ENGINE_TOKEN_S={args.tpot_ms / 1000:g}",
        "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
    }
    with celery_worker(logs / "worker.log", **env), \
            engine_agent(logs / "agent.log", **env), \
            panel_server(logs / "web.log", **env) as url:
        try:
            yield url
        finally:
            remove_engines()


def remove_engines() -> None:
    from tests.conftest_docker import remove_engines as remove
    from web.deployments.services.installation import instance_id

    remove(instance_id())


def fleet_spec(args: argparse.Namespace, name: str, gpu: int, replicas: int) -> dict[str, Any]:
    return {"name": name, "recipe": "kimi-k2.6-baseline", "gpus": [gpu], "self_check": False,
            "replicas": replicas,
            "engine": {"model_path": "/models/Kimi-K2.6", "tp_size": 1,
                       "trust_remote_code": True, "max_running_requests": args.batch},
            "extra_args": []}


@dataclass
class Fleet:
    rows: list[int]  # replica 0 first
    how: str  # how the replica rows were made
    urls: list[str] = field(default_factory=list)


def fleet_create(args: argparse.Namespace) -> Fleet:
    """Replica 0 with `replicas: 4`; the replicas code's rows when it made them, else three
    more deployments pointed at it with the ORM."""
    from web.deploy.services import deployment_create
    from web.deployments.models import Deployment

    Deployment.objects.filter(name__startswith=NAME).delete()
    first = deployment_create(data=fleet_spec(args, NAME, 0, REPLICAS), confirm_warnings=True)
    made = list(Deployment.objects.filter(replica_of=first).order_by("replica_index")
                .values_list("pk", flat=True))
    if len(made) == REPLICAS - 1:
        return Fleet([first.pk, *made], "replica rows made by deployment_create (replicas: 4)")
    Deployment.objects.filter(replica_of=first).delete()
    rows = [first.pk]
    for i in range(1, REPLICAS):
        other = deployment_create(data=fleet_spec(args, f"{NAME}-r{i}", i, 1),
                                  confirm_warnings=True)
        Deployment.objects.filter(pk=other.pk).update(replica_of=first, replica_index=i,
                                                      name=NAME)
        rows.append(other.pk)
    return Fleet(rows, "SHORTCUT: deployment_create made no replica rows; rows 1-3 are "
                       "deployments of their own pointed at row 0 with the ORM")


def fleet_wait_ready(fleet: Fleet, timeout_s: float = 240) -> None:
    from web.deployments.models import Deployment

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = {d.pk: d for d in Deployment.objects.filter(pk__in=fleet.rows)}
        failed = [d for d in rows.values() if d.status in ("failed", "stopped")]
        if failed:
            raise SystemExit(f"a replica ended: {[(d.pk, d.status) for d in failed]}")
        if all(d.status == "ready" and d.engine_url for d in rows.values()):
            fleet.urls = [rows[pk].engine_url.rstrip("/") for pk in fleet.rows]
            return
        time.sleep(0.5)
    raise SystemExit("the replicas were not all ready in time")


def rotation(fleet: Fleet, n: int) -> None:
    """The first n replicas in the gateway's rotation, the others draining."""
    from web.deployments.models import Deployment

    Deployment.objects.filter(pk__in=fleet.rows[:n]).update(draining=False)
    Deployment.objects.filter(pk__in=fleet.rows[n:]).update(draining=True)


def bench_key() -> str:
    from django.contrib.auth import get_user_model

    from web.gateway.services import apikey_create

    user, _ = get_user_model().objects.get_or_create(username=OWNER)
    user.is_superuser = True
    user.save()
    return apikey_create(owner_username=OWNER, name="fleet bench").secret


# ------------------------------------------------------------------ the client


@dataclass
class Outcome:
    started: float
    ended: float
    ok: bool
    tokens: int = 0
    ttfb: float = 0.0
    error: str = ""


def body(tokens: int, prompt: str = "hello") -> dict[str, Any]:
    return {"model": NAME, "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": prompt}]}


async def one_stream(session: Any, url: str, headers: dict[str, str], tokens: int,
                     prompt: str = "hello", payload: dict[str, Any] | None = None) -> Outcome:
    """A streamed chat completion (`payload`, else this bench's); ok when it ends with
    [DONE], `tokens` pieces and no error event."""
    import aiohttp

    started = time.perf_counter()
    got, first, done = 0, 0.0, False
    try:
        async with session.post(f"{url}/v1/chat/completions", json=payload or body(tokens, prompt),
                                headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                return Outcome(started, time.perf_counter(), False, error=f"{resp.status} {text}")
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                first = first or time.perf_counter() - started
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return Outcome(started, time.perf_counter(), False,
                                   error=str(event["error"].get("code")))
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        got += 1
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        return Outcome(started, time.perf_counter(), False, error=type(exc).__name__)
    ok = done and got == tokens
    return Outcome(started, time.perf_counter(), ok, got, first,
                   "" if ok else f"ended after {got} tokens, [DONE] {done}")


async def load(targets: list[tuple[str, dict[str, str]]], concurrency: int, seconds: float,
               tokens: int, events: list[tuple[float, str]] | None = None,
               during: Any = None) -> list[Outcome]:
    """`concurrency` clients, each sending back to back to the targets in turn, for
    `seconds`; `during` (a coroutine function) runs beside them (seconds 0: until it ends)."""
    import aiohttp

    outcomes: list[Outcome] = []
    stop_at = time.perf_counter() + seconds if seconds else float("inf")
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def client(i: int) -> None:
            n = i
            while time.perf_counter() < stop_at:
                url, headers = targets[n % len(targets)]
                n += concurrency
                outcomes.append(await one_stream(session, url, headers, tokens))

        tasks = [asyncio.create_task(client(i)) for i in range(concurrency)]
        if during is not None:
            await during()
            if not seconds:
                stop_at = time.perf_counter()
        await asyncio.gather(*tasks)
    return outcomes


def rate(outcomes: list[Outcome], seconds: float, skip_s: float) -> float:
    """Tokens a second of the streams that ended in the window after the warm-up."""
    t0 = min(o.started for o in outcomes) + skip_s
    window = [o for o in outcomes if o.ok and t0 <= o.ended <= t0 + seconds - skip_s]
    return sum(o.tokens for o in window) / (seconds - skip_s)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ the parts


def throughput(args: argparse.Namespace, fleet: Fleet, gw: str, headers: dict[str, str]) -> None:
    per_replica = args.batch / (args.tpot_ms / 1000)
    print(f"\n## Throughput (paced: TPOT {args.tpot_ms:g} ms, batch {args.batch}, "
          f"{args.tokens} tokens a request; ceiling {per_replica:.0f} tokens/s a replica)")
    print("| replicas | clients | direct tok/s | gateway tok/s | gateway / (N x gateway at 1) "
          "| direct / (N x direct at 1) | gateway / direct | failed (gw) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    base: dict[str, float] = {}
    for n in (1, 2, 4):
        rotation(fleet, n)
        time.sleep(1.5)  # the routing table re-read (a notification, at most 30 s)
        clients = 2 * args.batch * n  # twice the batch: every replica full, a queue behind
        direct = asyncio.run(load([(u, {}) for u in fleet.urls[:n]], clients, args.seconds,
                                  args.tokens))
        through = asyncio.run(load([(gw, headers)], clients, args.seconds, args.tokens))
        d, g = rate(direct, args.seconds, 2.0), rate(through, args.seconds, 2.0)
        base.setdefault("d", d)
        base.setdefault("g", g)
        failed = sum(not o.ok for o in through)
        print(f"| {n} | {clients} | {d:.0f} | {g:.0f} | {g / (n * base['g']):.2f}x "
              f"| {d / (n * base['d']):.2f}x | {g / d:.2f}x | {failed} |", flush=True)
    rotation(fleet, REPLICAS)


async def sequential_ttfb(paths: dict[str, list[tuple[str, dict[str, str]]]], n: int
                          ) -> dict[str, list[float]]:
    import aiohttp

    out: dict[str, list[float]] = {name: [] for name in paths}
    async with aiohttp.ClientSession() as session:
        for targets in paths.values():  # warm every connection
            for url, headers in targets * 3:
                await one_stream(session, url, headers, 1)
        for i in range(n):
            for name, targets in (paths.items() if i % 2 else reversed(paths.items())):
                url, headers = targets[i % len(targets)]
                o = await one_stream(session, url, headers, 1)
                if not o.ok:
                    raise SystemExit(f"{name}: {o.error}")
                out[name].append(o.ttfb * 1000)
    return out


def ttfb(args: argparse.Namespace, fleet: Fleet, gw: str, headers: dict[str, str]) -> None:
    rotation(fleet, REPLICAS)
    samples = asyncio.run(sequential_ttfb(
        {"direct": [(u, {}) for u in fleet.urls], "gateway": [(gw, headers)]},
        args.ttfb_requests))
    d, g = samples["direct"], samples["gateway"]
    print(f"\n## TTFB at {REPLICAS} replicas ({args.ttfb_requests} sequential streams a path, "
          f"interleaved; 1 token: TTFB includes one TPOT of {args.tpot_ms:g} ms on both)")
    print("| path | p50 | p99 | added p50 | added p99 |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| direct (round robin over {REPLICAS}) | {pct(d, .5):.2f} ms | {pct(d, .99):.2f} ms "
          "| | |")
    added99 = pct(g, .99) - pct(d, .99)
    print(f"| gateway | {pct(g, .5):.2f} ms | {pct(g, .99):.2f} ms "
          f"| {pct(g, .5) - pct(d, .5):.2f} ms | **{added99:.2f} ms** |")
    print(f"target added p99 < 2 ms: {'met' if added99 < 2 else 'NOT met'} in this run")


def kill_engine(row: int) -> None:
    from tests.conftest_docker import engines_of
    from web.deployments.services.installation import instance_id

    for container in engines_of(instance_id(), row):
        if container.status == "running":
            container.kill()


def status_of(row: int) -> str:
    from web.deployments.models import Deployment

    return str(Deployment.objects.filter(pk=row).values_list("status", flat=True).first())


def failover(args: argparse.Namespace, fleet: Fleet, gw: str, headers: dict[str, str]) -> None:
    rotation(fleet, REPLICAS)
    victim = fleet.rows[-1]
    marks: dict[str, float] = {}

    async def kill_then_watch() -> None:
        await asyncio.sleep(3)
        marks["kill"] = time.perf_counter()
        await asyncio.to_thread(kill_engine, victim)
        while time.perf_counter() - marks["kill"] < 20:
            status = await asyncio.to_thread(status_of, victim)
            if status != "ready" and "left_ready" not in marks:
                marks["left_ready"] = time.perf_counter()
            await asyncio.sleep(0.1)

    clients = 2 * args.batch * REPLICAS
    outcomes = asyncio.run(load([(gw, headers)], clients, 14, args.tokens,
                                during=kill_then_watch))
    kill = marks["kill"]
    failed = [o for o in outcomes if not o.ok]
    after = [o for o in failed if o.ended >= kill]
    last = max((o.ended - kill for o in after), default=0.0)
    left = marks.get("left_ready", 0.0) - kill if "left_ready" in marks else None
    print(f"\n## Failover: replica {REPLICAS - 1}'s engine killed (docker kill) under "
          f"{clients} clients through the gateway")
    print(f"- requests: {len(outcomes)}, failed: {len(failed)} ({len(after)} after the kill)")
    print(f"- last failed request ended {last:.2f} s after the kill "
          "(no request failed there after it: the failover time as a client sees it)")
    print("- the row left `ready` " + (f"{left:.2f} s after the kill" if left is not None
                                       else "not within 20 s") + f" (status {status_of(victim)})")
    kinds: dict[str, int] = {}
    for o in after:
        kinds[o.error[:60]] = kinds.get(o.error[:60], 0) + 1
    if kinds:
        print(f"- failures by kind: {kinds}")


def roll_state(row: int) -> dict[str, Any]:
    from web.deployments.models import Deployment

    return dict(Deployment.objects.filter(pk=row).values_list("rolling", flat=True).first()
                or {})


def rolling(args: argparse.Namespace, fleet: Fleet, gw: str, headers: dict[str, str]) -> None:
    """A rolling redeploy (a new spec: one SGLANG_* env value, which the engine ignores)
    under load through the gateway; every request that fails is counted, from the redeploy
    to the roll's end."""
    from web.deployments import services
    from web.deployments.models import Deployment

    print("\n## Rolling redeploy under load")
    redeploy = getattr(services, "deployment_redeploy", None)
    if redeploy is None or not hasattr(Deployment, "rolling"):
        print("- NOT RUN: no rolling redeploy in this checkout (deployment_redeploy and "
              "Deployment.rolling); the rolling helper's work is not merged yet")
        return
    rotation(fleet, REPLICAS)
    for pk in Deployment.objects.filter(pk__in=fleet.rows, status__in=("failed", "stopped")
                                        ).values_list("pk", flat=True):
        services.deployment_restart(deployment_id=pk)  # the failover's victim, back
    fleet_wait_ready(fleet)
    row = Deployment.objects.get(pk=fleet.rows[0])
    data = {**row.spec, "env": {**(row.spec.get("env") or {}),
                                "SGLANG_FLEET_BENCH_ROLL": str(time.time_ns())}}
    marks: dict[str, Any] = {}

    async def roll() -> None:
        await asyncio.sleep(2)
        marks["start"] = time.perf_counter()
        await asyncio.to_thread(redeploy, deployment_id=fleet.rows[0], data=data,
                                confirm_warnings=True)
        while time.perf_counter() - marks["start"] < 300:
            state = await asyncio.to_thread(roll_state, fleet.rows[0])
            if state.get("state") not in (None, "rolling"):
                marks["state"] = state
                break
            await asyncio.sleep(0.5)
        marks["end"] = time.perf_counter()
        await asyncio.sleep(2)  # the last replica back in the rotation, under load

    clients = 2 * args.batch * REPLICAS
    outcomes = asyncio.run(load([(gw, headers)], clients, 0, args.tokens, during=roll))
    failed = [o for o in outcomes if not o.ok]
    state = marks.get("state") or {}
    print(f"- {REPLICAS} replicas, {clients} clients through the gateway; the roll "
          f"{state.get('state', 'did not end within 300 s')} after "
          f"{marks['end'] - marks['start']:.1f} s ({state.get('cause') or 'no cause'})")
    print(f"- requests: {len(outcomes)}, **failed: {len(failed)}**")
    kinds: dict[str, int] = {}
    for o in failed:
        kinds[o.error[:60]] = kinds.get(o.error[:60], 0) + 1
    if kinds:
        print(f"- failures by kind: {kinds}")


def main() -> None:
    args = parse_args()
    skip = set(filter(None, args.skip.split(",")))
    models = tempfile.mkdtemp(prefix="fleet-bench-models-")
    sys.path.insert(0, str(ROOT))  # the checkout's tests package, run from anywhere
    from tests.models import write_models  # the model folders pre-flight reads (no weights)

    write_models(Path(models))
    # This process validates the specs as the panel does, on a machine without GPUs.
    os.environ.update(APPLIANCE_MODEL_ROOTS=models, APPLIANCE_ENGINE_GPU_REQUESTS="0")
    _loadkit.setup_django(args)
    load1 = os.getloadavg()
    print(f"# bench/fleet.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"command: {_loadkit.command_line()}")
    print(f"load average before: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} "
          f"({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, stack(args, Path(tmp)) as gw:
        fleet = fleet_create(args)
        print(f"replicas: {fleet.how}")
        print("road: worker, agent and panel as processes of this checkout (not compose "
              "containers); the gateway reaches the engines at their loopback-published ports")
        fleet_wait_ready(fleet)
        headers = {"Authorization": f"Bearer {bench_key()}"}
        try:
            if "throughput" not in skip:
                throughput(args, fleet, gw, headers)
            if "ttfb" not in skip:
                ttfb(args, fleet, gw, headers)
            if "failover" not in skip:
                failover(args, fleet, gw, headers)
            if "rolling" not in skip:
                rolling(args, fleet, gw, headers)
        finally:
            from web.deployments.services import deployment_stop

            for row in fleet.rows:
                deployment_stop(deployment_id=row)
    load2 = os.getloadavg()
    print(f"\nload average after: {load2[0]:.2f} {load2[1]:.2f} {load2[2]:.2f}")


if __name__ == "__main__":
    main()
