"""The gateway's ceiling: streamed tokens a second per core through one gateway instance,
against the same engines called directly, so an operator can size it.

    python bench/gateway_ceiling.py [--engines 2] [--concurrency 64,256,512] [--seconds 10] \\
        [--tokens 200] [--step-ms 20] [--gateway-cpu 0] [--client-cpu 1] [--gateway-nice 0] \\
        [--database-url postgres://USER@HOST:PORT/DB] [--redis-url redis://HOST:PORT/N]

What it runs, said here so the figures are read right:
- the engines are this script's own SSE servers (`--serve-engine PORT`, one process each,
  asyncio, every event encoded once at start), not the test engine: its thread per stream
  and sleep per token make it slower than the gateway, and the gateway's ceiling is only seen
  on engines that can outrun it. Each stream is paced as a decode is, one event every
  --step-ms (20 ms: 50 tok/s a stream), one token an event (a speculative engine's event
  carries several: multiply), each event the size of SGLang's chat chunks (about 230 bytes),
  with the usage chunk and [DONE] at the end. The gateway's work is per event, so the
  events' spacing matters: sent all at once, events would reach the gateway many to a read.
- one deployment with a replica per engine (the gateway spreads the streams over them); a
  key without a rate limit. The panel runs as the panel image runs it: `uvicorn
  web.asgi:application`, one process, production settings, pinned to --gateway-cpu.
- the client is this process (asyncio, raw HTTP/1.1, counting events), pinned to
  --client-cpu with the engines; its own CPU is reported beside each figure, since on a
  small machine it competes with the engines for their core.
- each --concurrency level runs --seconds direct (the client spread over the engines), then
  --seconds through the gateway: C streams open at any time, each followed by the next.
  "tokens/s" counts events received; "per gateway core" is tokens over the gateway
  process's CPU seconds in the same window: the rate one fully busy core would relay (the
  ceiling), read even where the load did not fill the core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _loadkit  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parent.parent
MODEL = "gw-ceiling"


# ------------------------------------------------------------------ the fast engine

def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "a3c1f0d2b9e84c55a1d2e3f4a5b6c7d8", "object": "chat.completion.chunk",
            "created": 1796534149, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish}]}
    return _chunk(b"data: " + json.dumps(body).encode() + b"\n\n")


async def _serve_engine(port: int, step_s: float) -> None:
    """As SGLang's scheduler does, one decode step a tick makes a token for every running
    stream at once: one timer for the engine, not one per stream (so the engine's cost per
    event is a socket write, and it outruns the gateway)."""
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
    first = _event({"role": "assistant", "content": ""})
    token = _event({"content": " token"})
    usage = _chunk(b"data: " + json.dumps({
        "id": "x", "object": "chat.completion.chunk", "created": 1796534149, "model": MODEL,
        "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 0,
                                 "total_tokens": 8}}).encode() + b"\n\n")
    end = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    health = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    running: dict[asyncio.StreamWriter, list[Any]] = {}  # -> [tokens left, last, done]

    async def tick() -> None:
        while True:
            await asyncio.sleep(step_s)
            for writer, state in list(running.items()):
                if writer.is_closing():
                    running.pop(writer)
                    state[2].set_result(None)
                    continue
                state[0] -= 1
                writer.write(token if state[0] > 0 else token + state[1])
                if state[0] <= 0:
                    running.pop(writer)
                    state[2].set_result(None)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in request.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                if request.startswith(b"GET"):
                    writer.write(health)
                    continue
                tokens = int(json.loads(body).get("max_tokens") or 16)
                writer.write(head + first)
                done = asyncio.get_running_loop().create_future()
                running[writer] = [tokens, (usage if b"include_usage" in body else b"") + end,
                                   done]
                await done
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            running.pop(writer, None)
            writer.close()

    ticker = asyncio.ensure_future(tick())
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()
    ticker.cancel()


@contextmanager
def engines(count: int, step_s: float, cpu: int) -> Iterator[tuple[list[str], list[int]]]:
    procs, urls = [], []
    try:
        for _ in range(count):
            port = _loadkit._free_port()
            procs.append(subprocess.Popen(
                ["taskset", "-c", str(cpu), sys.executable, __file__, "--serve-engine",
                 str(port), "--step-ms", str(step_s * 1000)], cwd=ROOT))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            _wait(url + "/health", proc)
        yield urls, [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    import requests

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: exited {proc.returncode}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


# ------------------------------------------------------------------ the panel

@contextmanager
def panel(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    import secrets

    port = _loadkit._free_port()
    env = {**os.environ, "APPLIANCE_DATABASE_URL": args.database_url,
           "APPLIANCE_REDIS_URL": args.redis_url,
           "APPLIANCE_SECRET_KEY": secrets.token_urlsafe(48), "DJANGO_SETTINGS_MODULE":
           "web.settings", "PYTHONUNBUFFERED": "1"}
    env.pop("APPLIANCE_DEBUG", None)
    log = Path("/tmp") / f"gw-ceiling-panel-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["taskset", "-c", str(args.gateway_cpu), sys.executable, "-m", "uvicorn",
             "web.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning", "--no-access-log", "--backlog", "4096"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _loadkit.wait_healthy(url, proc, log)
        if args.gateway_nice:  # a shared machine: the gateway's core less contended
            os.setpriority(os.PRIO_PROCESS, proc.pid, args.gateway_nice)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def fixture(urls: list[str]) -> str:
    """One ready deployment, a replica row per engine; a key without a rate limit."""
    from django.contrib.auth import get_user_model

    from web.deployments.models import Deployment
    from web.gateway.services import apikey_create

    user, _ = get_user_model().objects.get_or_create(username="gw-ceiling")
    user.is_superuser = True
    user.save()
    Deployment.objects.filter(name=MODEL).delete()
    rows: list[Any] = []
    for i, url in enumerate(urls):
        rows.append(Deployment.objects.create(
            name=MODEL, spec={"name": MODEL, "engine": {}}, recipe="bench", algorithm="NONE",
            gpus=[i], status="ready", engine_url=url, replica_of=rows[0] if rows else None,
            replica_index=i))
    return apikey_create(owner_username="gw-ceiling", name="ceiling").secret


# ------------------------------------------------------------------ the client

class _Client(asyncio.Protocol):
    """One streaming call: counts the events that come ("data: " lines), done at [DONE]."""

    def __init__(self, counts: list[int], done: asyncio.Future[None]) -> None:
        self.counts, self.done, self.tail = counts, done, b""

    def data_received(self, data: bytes) -> None:
        seen = self.tail + data  # (an event's "data: " may straddle two reads)
        self.counts[0] += seen.count(b"data: ") - self.tail.count(b"data: ")
        self.tail = seen[-5:]
        if b"data: [DONE]" in seen and not self.done.done():
            self.counts[1] += 1
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"closed early: {exc}"))


async def _stream(base: str, auth: str, tokens: int, counts: list[int]) -> None:
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "ceiling"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
               + (f"Authorization: Bearer {auth}\r\n" if auth else "")
               + "\r\n").encode() + body
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    done.add_done_callback(lambda f: f.cancelled() or f.exception())  # (read: counted below)
    transport, _ = await loop.create_connection(lambda: _Client(counts, done), host, int(port))
    try:
        transport.write(request)
        await done
    finally:
        transport.close()


async def load(bases: list[str], auth: str, concurrency: int, seconds: float,
               tokens: int) -> tuple[int, int, int]:
    """(events, streams ended with [DONE], failed streams) over `seconds`."""
    counts = [0, 0, 0]
    deadline = time.monotonic() + seconds

    async def worker(i: int) -> None:
        while time.monotonic() < deadline:
            try:
                await _stream(bases[i % len(bases)], auth, tokens, counts)
            except OSError:
                counts[2] += 1

    tasks = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
    await asyncio.sleep(seconds)
    taken = counts[0]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return taken, counts[1], counts[2]


def _cpu(pids: list[int]) -> float:
    return _loadkit.cpu_seconds(pids)


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def measure(name: str, bases: list[str], auth: str, args: argparse.Namespace, c: int,
            gateway_pid: int | None, engine_pids: list[int]) -> dict[str, float]:
    asyncio.run(load(bases, auth, min(c, 16), 2, args.tokens))  # warm the pools
    own, gw, eng = _own_cpu(), _cpu([gateway_pid] if gateway_pid else []), _cpu(engine_pids)
    started = time.monotonic()
    events, done, failed = asyncio.run(load(bases, auth, c, args.seconds, args.tokens))
    wall = time.monotonic() - started
    result = {"tokens_s": events / wall, "client_cpu": (_own_cpu() - own) / wall,
              "engine_cpu": (_cpu(engine_pids) - eng) / wall, "done": done, "failed": failed}
    line = (f"  {name:<8} c={c:<5} {events / wall:9.0f} tok/s  client CPU "
            f"{result['client_cpu'] * 100:4.0f} %  engines' CPU "
            f"{result['engine_cpu'] * 100:4.0f} %")
    if gateway_pid:
        gw_cpu = (_cpu([gateway_pid]) - gw) / wall
        result["gateway_cpu"] = gw_cpu
        line += (f"  gateway CPU {gw_cpu * 100:4.0f} %  per gateway core "
                 f"{events / wall / max(gw_cpu, 1e-9):8.0f} tok/s")
    print(line + f"  ({done} streams whole, {failed} failed)", flush=True)
    return result


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-engine":
        step = float(sys.argv[sys.argv.index("--step-ms") + 1]) / 1000
        asyncio.run(_serve_engine(int(sys.argv[2]), step))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _loadkit.add_common_args(parser)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--concurrency", default="64,256,512")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=20)
    parser.add_argument("--gateway-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--gateway-nice", type=int, default=0,
                        help="the gateway process's nice value (negative: ahead of others)")
    args = parser.parse_args()
    _loadkit.setup_django(args)
    os.sched_setaffinity(0, {args.client_cpu})
    print(f"# {_loadkit.command_line()}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load "
          f"{os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min), {os.cpu_count()} "
          f"CPUs; gateway on CPU {args.gateway_cpu} (nice {args.gateway_nice}), engines and "
          f"client on CPU "
          f"{args.client_cpu}; streams of {args.tokens} tokens, one every {args.step_ms} ms")
    with ExitStack() as stack:
        urls, engine_pids = stack.enter_context(
            engines(args.engines, args.step_ms / 1000, args.client_cpu))
        secret = fixture(urls)
        gateway_url, gateway_pid = stack.enter_context(panel(args))
        for c in (int(x) for x in args.concurrency.split(",")):
            measure("direct", urls, "", args, c, None, engine_pids)
            measure("gateway", [gateway_url], secret, args, c, gateway_pid, engine_pids)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
