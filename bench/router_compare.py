"""The data plane among replicas, on evidence: SGLang's model gateway (sglang-router) behind
the pass-through, against the pass-through's own balancing, over the same 4 paced engines.

    python bench/router_compare.py --router /tmp/venv/bin/sglang-router \\
        [--database-url URL] [--redis-url URL] [--requests 300] [--tpot-ms 20] [--batch 4]

Three figures, each path in the same run:
- added TTFB at 4 replicas: sequential one-token streams, the paths interleaved, against the
  engines called directly in turn (p50, p99, and gateway minus direct at each);
- prefix-cache hit rate on a shared-prefix workload: 8 system prompts of 300 words, 24
  questions each, sent in a shuffled order by 8 clients; the rate is the engines' own
  `sglang:cached_tokens_total` over `sglang:prompt_tokens_total` across the 4 engines (each
  path has prefixes of its own, so no path finds another's in the cache);
- failover: one engine killed (SIGKILL) under 16 clients; failed requests and the time from
  the kill to the last failed one (after it no request went there, as a client sees it).

Paths:
- `direct`: the client sends to the 4 engines in turn (perfect spreading, no cache affinity);
- `router`: the panel's gateway (a deployment whose engine URL is the router) in front of
  sglang-router in front of the 4 engines, `--policy cache_aware` (its default), health checks
  every second; a second router with `--policy round_robin` for the prefix figure only;
- `own`: the panel's gateway routing among 4 replica rows itself (replica 0 and rows 1-3 with
  replica_of set, made with the ORM, each row's engine URL one engine).

Shortcuts: the engines are test engine processes (docker/test-engine, a simulator: fixed TPOT,
`--max-running-requests`, a prefix cache reported as SGLang reports it) on loopback, not
containers; the panel is `uvicorn web.asgi:application` as its image runs it
(gateway_overhead.py's); the deployment rows are made with the ORM, ready, no agent behind
them, so only the gateway itself can take a dead replica out of `own`'s rotation.
sglang-router is PyPI's, installed apart (no dependency of the product).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _loadkit  # noqa: E402  (bench/ is not a package)
import fleet  # noqa: E402
import gateway_overhead as gwo  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ENGINES = 4
GROUPS, QUESTIONS, PREFIX_WORDS = 8, 24, 300


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _loadkit.add_common_args(p)
    p.add_argument("--router", required=True, help="the sglang-router executable")
    p.add_argument("--requests", type=int, default=300, help="TTFB streams a path")
    p.add_argument("--tpot-ms", type=float, default=20.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--skip", default="", help="comma-separated: ttfb,prefix,failover")
    return p.parse_args()


class Engine:
    """A paced test engine process on loopback that can be killed and started again."""

    def __init__(self, port: int, tpot_ms: float, batch: int) -> None:
        self.port, self.tpot_ms, self.batch = port, tpot_ms, batch
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "docker" / "test-engine"),
               "TEST_ENGINE_PACE_S": "0.001", "TEST_ENGINE_TOKEN_S": str(self.tpot_ms / 1000)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", gwo.ENGINE_MAIN, "--model-path", "/models/bench",
             "--served-model-name", "rc", "--host", "127.0.0.1", "--port", str(self.port),
             "--max-running-requests", str(self.batch), "--enable-cache-report",
             "--enable-metrics"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        gwo.wait_http(f"{self.url}/health", self.proc, f"engine {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def counters(self) -> tuple[float, float]:
        """(cached prompt tokens, prompt tokens) so far, from its /metrics."""
        import requests

        text = requests.get(f"{self.url}/metrics", timeout=5).text
        cached = prompt = 0.0
        for line in text.splitlines():
            if line.startswith("sglang:cached_tokens_total{"):
                cached += float(line.rsplit(" ", 1)[1])
            elif line.startswith("sglang:prompt_tokens_total{"):
                prompt = float(line.rsplit(" ", 1)[1])
        return cached, prompt


@contextlib.contextmanager
def engines(args: argparse.Namespace) -> Iterator[list[Engine]]:
    made = [Engine(gwo.free_port(), args.tpot_ms, args.batch) for _ in range(ENGINES)]
    try:
        for engine in made:
            engine.start()
        yield made
    finally:
        for engine in made:
            engine.kill()


@contextlib.contextmanager
def router(path: str, urls: list[str], policy: str) -> Iterator[str]:
    port = gwo.free_port()
    with gwo.process([path, "launch", "--host", "127.0.0.1", "--port", str(port),
                      "--worker-urls", *urls, "--policy", policy, "--log-level", "warn",
                      "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                      "--health-check-timeout-secs", "1",
                      "--prometheus-port", str(gwo.free_port())],
                     f"http://127.0.0.1:{port}/health", f"router-{policy}"):
        yield f"http://127.0.0.1:{port}"


def rows(name: str, urls: list[str]) -> None:
    """A ready deployment `name`: one row per URL, rows 1.. replicas of row 0 (ORM)."""
    from web.deployments.models import Deployment

    Deployment.objects.filter(name=name).delete()
    first = None
    for i, url in enumerate(urls):
        row = Deployment.objects.create(
            name=name, spec={"name": name, "engine": {}}, recipe="bench", algorithm="NONE",
            gpus=[i], status="ready", engine_url=url, replica_of=first, replica_index=i)
        first = first or row


def key() -> str:
    from django.contrib.auth import get_user_model

    from web.gateway.services import apikey_create

    user, _ = get_user_model().objects.get_or_create(username="rc-bench")
    user.is_superuser = True
    user.save()
    return apikey_create(owner_username="rc-bench", name="router compare").secret


def chat(model: str, prompt: str, tokens: int) -> dict[str, Any]:
    return {"model": model, "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": prompt}]}


async def stream(session: Any, url: str, headers: dict[str, str], body: dict[str, Any]
                 ) -> fleet.Outcome:
    return await fleet.one_stream(session, url, headers, body["max_tokens"], payload=body)


async def ttfb_samples(paths: dict[str, list[tuple[str, dict[str, str], str]]], n: int
                       ) -> dict[str, list[float]]:
    import aiohttp

    out: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    order = random.Random(34)
    async with aiohttp.ClientSession() as session:
        for targets in paths.values():
            for url, headers, model in targets * 3:
                await stream(session, url, headers, chat(model, "hello", 1))
        for i in range(n):
            order.shuffle(names)
            for name in names:
                url, headers, model = paths[name][i % len(paths[name])]
                o = await stream(session, url, headers, chat(model, "hello", 1))
                if not o.ok:
                    raise SystemExit(f"{name}: {o.error}")
                out[name].append(o.ttfb * 1000)
    return out


def workload(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{rng.randrange(10**6)}" for _ in range(GROUPS * PREFIX_WORDS)]
    prompts = [" ".join(words[g * PREFIX_WORDS:(g + 1) * PREFIX_WORDS]) + f" question {q}?"
               for g in range(GROUPS) for q in range(QUESTIONS)]
    rng.shuffle(prompts)
    return prompts


async def run_prompts(url: str, headers: dict[str, str], model: str, prompts: list[str],
                      clients: int) -> int:
    import aiohttp

    queue = list(prompts)
    failed = 0
    async with aiohttp.ClientSession() as session:
        async def client() -> None:
            nonlocal failed
            while queue:
                o = await stream(session, url, headers, chat(model, queue.pop(), 2))
                failed += not o.ok
        await asyncio.gather(*(client() for _ in range(clients)))
    return failed


def hit_rate(made: list[Engine], run: Any) -> tuple[float, int, int]:
    """The workload's hit rate over all engines, its failed requests, and how many engines
    it reached (a path that sends everything to one engine has the best rate trivially)."""
    before = [e.counters() for e in made]
    failed = run()
    after = [e.counters() for e in made]
    cached = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    prompt = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    used = sum(a[1] > b[1] for a, b in zip(after, before, strict=True))
    return (cached / prompt if prompt else 0.0), failed, used


async def failover_load(url: str, headers: dict[str, str], model: str, victim: Engine,
                        seconds: float = 10.0) -> tuple[int, int, float]:
    import aiohttp

    outcomes: list[fleet.Outcome] = []
    stop_at = time.perf_counter() + seconds
    kill_at: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def client() -> None:
            while time.perf_counter() < stop_at:
                outcomes.append(await stream(session, url, headers, chat(model, "hello", 8)))

        async def killer() -> None:
            await asyncio.sleep(2)
            kill_at["t"] = time.perf_counter()
            await asyncio.to_thread(victim.kill)

        await asyncio.gather(killer(), *(client() for _ in range(16)))
    failed = [o for o in outcomes if not o.ok]
    last = max((o.ended - kill_at["t"] for o in failed), default=0.0)
    return len(outcomes), len(failed), last


def main() -> None:
    args = parse_args()
    skip = set(filter(None, args.skip.split(",")))
    _loadkit.setup_django(args)
    load = os.getloadavg()
    print(f"# bench/router_compare.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"command: {_loadkit.command_line()}")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} CPUs)")
    print(f"engines: {ENGINES} test engine processes, TPOT {args.tpot_ms:g} ms, "
          f"--max-running-requests {args.batch}")
    with engines(args) as made, gwo.panel(args) as (gw, _pid):
        urls = [e.url for e in made]
        headers = {"Authorization": f"Bearer {key()}"}
        with router(args.router, urls, "cache_aware") as rt, \
                router(args.router, urls, "round_robin") as rr:
            rows("rc-router", [rt])
            rows("rc-rr", [rr])
            rows("rc-own", urls)
            time.sleep(1.5)
            if "ttfb" not in skip:
                samples = asyncio.run(ttfb_samples({
                    "direct": [(u, {}, "rc") for u in urls],
                    "router": [(gw, headers, "rc-router")],
                    "own": [(gw, headers, "rc-own")]}, args.requests))
                d = samples["direct"]
                print(f"\n## TTFB at {ENGINES} replicas ({args.requests} one-token streams a "
                      f"path, interleaved at random; each includes one TPOT)")
                print("| path | p50 | p99 | added p50 | added p99 |")
                print("| --- | --- | --- | --- | --- |")
                for name, s in samples.items():
                    added = ("| |" if name == "direct" else
                             f"| {fleet.pct(s, .5) - fleet.pct(d, .5):.2f} ms "
                             f"| **{fleet.pct(s, .99) - fleet.pct(d, .99):.2f} ms** |")
                    print(f"| {name} | {fleet.pct(s, .5):.2f} ms | {fleet.pct(s, .99):.2f} ms "
                          f"{added}")
            if "prefix" not in skip:
                print(f"\n## Prefix-cache hit rate ({GROUPS} prefixes of {PREFIX_WORDS} words x "
                      f"{QUESTIONS} questions, shuffled, 8 clients; engines' own counters)")
                print("| path | hit rate | failed | engines it reached |")
                print("| --- | --- | --- | --- |")
                ideal = (GROUPS * QUESTIONS - GROUPS) / (GROUPS * QUESTIONS)
                for seed, (name, url, hdrs, model) in enumerate([
                        ("direct, round robin", None, {}, "rc"),
                        ("router cache_aware", gw, headers, "rc-router"),
                        ("router round_robin", gw, headers, "rc-rr"),
                        ("own", gw, headers, "rc-own")]):
                    prompts = workload(seed)
                    if url is None:
                        def run(prompts: list[str] = prompts) -> int:
                            parts = [prompts[i::ENGINES] for i in range(ENGINES)]
                            return sum(asyncio.run(run_prompts(u, {}, "rc", p, 2))
                                       for u, p in zip(urls, parts, strict=True))
                    else:
                        def run(prompts: list[str] = prompts, url: str = url,
                                hdrs: dict[str, str] = hdrs, model: str = model) -> int:
                            return asyncio.run(run_prompts(url, hdrs, model, prompts, 8))
                    rate, failed, used = hit_rate(made, run)
                    print(f"| {name} | {rate:.1%} | {failed} | {used} of {ENGINES} |",
                          flush=True)
                print(f"(one miss per prefix, the rest hits: {ideal:.1%} of requests; "
                      "a request's last token is never cached)")
            if "failover" not in skip:
                print("\n## Failover: one engine killed (SIGKILL) under 16 clients, 10 s")
                print("| path | requests | failed | last failure after the kill |")
                print("| --- | --- | --- | --- |")
                for name, model in (("router cache_aware", "rc-router"), ("own", "rc-own")):
                    victim = made[-1]
                    n, failed, last = asyncio.run(failover_load(gw, headers, model, victim))
                    print(f"| {name} | {n} | {failed} | {last:.2f} s |", flush=True)
                    victim.start()
                    time.sleep(3)  # the router's health check takes it back
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
