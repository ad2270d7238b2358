"""Paced engines for Tune's bench and tests: one loopback server per candidate whose speed
and acceptance are set, so the fastest candidate at each concurrency is known beforehand.

A request's tokens come `accept_len` per decode step, and a step costs
`step_s * (1 + slope * (running - 1))` (more requests in the batch, a costlier step; a
wider verify, a larger `slope`): at concurrency c the candidate's output throughput is about
c * accept_len / (step_s * (1 + slope * (c - 1))), `expected_throughput`. /generate answers
the same tokens for every candidate, with the baseline's top log-probs (a clear margin
between the first two), except a `lossy` candidate, which takes the second choice at
token 3; a speculative one refuses log-probs with SGLang's 400. Served on a thread of its
own (aiohttp); `stop()` ends it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from appliance.tune.candidates import Candidate
from appliance.tune.run import DeployFailed

LOSSY_AT = 3


@dataclass(frozen=True)
class Pace:
    step_s: float  # one decode step alone
    accept_len: float = 1.0  # tokens per step
    slope: float = 0.0  # the step's growth per other running request
    speculative: bool = False
    lossy: bool = False

    def expected_throughput(self, concurrency: int) -> float:
        return concurrency * self.accept_len / (self.step_s * (1 + self.slope *
                                                              (concurrency - 1)))


def _token(prompt: str, k: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{prompt}/{k}".encode()).digest()[:3], "big")


class PacedEngine:
    def __init__(self, pace: Pace, name: str = "paced") -> None:
        self.pace, self.name = pace, name
        self.running = 0
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"paced-{name}")

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the paced engine did not start in 10 s")
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/server_info", self._info)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": self.name}]})

    async def _info(self, request: web.Request) -> web.Response:
        state = {"avg_spec_accept_length": self.pace.accept_len} if self.pace.speculative \
            else {}
        return web.json_response({"internal_states": [state]})

    def _step(self) -> float:
        return self.pace.step_s * (1 + self.pace.slope * max(0, self.running - 1))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.running += 1
        try:
            made, credit = 0, 0.0
            due = time.perf_counter()
            while made < n:
                due += self._step()
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                credit += self.pace.accept_len
                k = min(n - made, int(credit))
                credit -= k
                if k:
                    made += k
                    chunk = {"choices": [{"index": 0, "delta": {"content": " tok" * k},
                                          "finish_reason": None}]}
                    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        finally:
            self.running -= 1
        usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n}}
        await response.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("return_logprob") and self.pace.speculative:
            return web.Response(status=400, text=json.dumps({"error": {
                "message": "speculative decoding does not support return_logprob yet"}}))
        prompt = str(body.get("text") or "")
        n = int((body.get("sampling_params") or {}).get("max_new_tokens") or 16)
        ids = [_token(prompt, k) for k in range(n)]
        top = [[[-0.05, t, f"t{t}"], [-3.0, t + 1, f"t{t + 1}"]] for t in ids]
        if self.pace.lossy and n > LOSSY_AT:
            ids[LOSSY_AT] += 1
        meta: dict[str, Any] = {"completion_tokens": n}
        if body.get("return_logprob"):
            meta["output_top_logprobs"] = top
            meta["output_token_logprobs"] = [[-0.05, t, f"t{t}"] for t in ids]
        return web.json_response({"text": "".join(f"t{t}" for t in ids), "output_ids": ids,
                                  "meta_info": meta})


class PacedProcess:
    """A PacedEngine in a process of its own (`python -m appliance.tune.paced`), so that a
    client in the caller's process does not share its interpreter: the bench's road."""

    def __init__(self, pace: Pace, name: str = "paced") -> None:
        self.pace, self.name = pace, name
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> str:
        p = self.pace
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.tune.paced", str(p.step_s), str(p.accept_len),
             str(p.slope), str(int(p.speculative)), str(int(p.lossy)), self.name],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()  # its URL, once it listens
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the paced engine {self.name} did not start")
        return line

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None


class PacedDeployer:
    """Tune's `Deployer` over paced engines: one engine at a time, as candidates on one
    deployment's GPUs run; `restore` brings back the engine of `original` (the deployment's
    own configuration). `paces`: each candidate's name to its pace; a candidate named in
    `refused` fails pre-flight with that finding."""

    def __init__(self, paces: dict[str, Pace], original: str,
                 refused: dict[str, str] | None = None, *, processes: bool = False) -> None:
        self.paces, self.original, self.refused = paces, original, refused or {}
        self.processes = processes
        self.engine: PacedEngine | PacedProcess | None = None
        self.deployed: list[str] = []
        self.current = ""
        self._swap(original)
        self.deployed.clear()

    def _swap(self, name: str) -> str:
        if self.engine is not None:
            self.engine.stop()
        kind = PacedProcess if self.processes else PacedEngine
        self.engine = kind(self.paces[name], name)
        self.current = name
        self.deployed.append(name)
        return self.engine.start()

    def preflight(self, candidate: Candidate) -> list[str]:
        found = self.refused.get(candidate.name)
        return [found] if found else []

    def deploy(self, candidate: Candidate, stop: Callable[[], bool]) -> str:
        if candidate.name not in self.paces:
            raise DeployFailed(f"{candidate.name}: no engine paced for it")
        return self._swap(candidate.name)

    def restore(self) -> str:
        self._swap(self.original)
        return f"{self.original} serving again"

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            self.engine = None


if __name__ == "__main__":
    # python -m appliance.tune.paced STEP_S ACCEPT_LEN SLOPE SPECULATIVE LOSSY [NAME]: prints
    # its URL, serves until terminated.
    import signal

    a = sys.argv[1:]
    engine = PacedEngine(Pace(float(a[0]), float(a[1]), float(a[2]), a[3] == "1", a[4] == "1"),
                         a[5] if len(a) > 5 else "paced")
    print(engine.start(), flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
