"""A sweep of concurrency levels against one or more targets (A/B), with progress and cancel.

Each level runs the same prompts: a warm-up, then the requests under a semaphore of the
level's concurrency, arriving all at once or as a Poisson process (`request_rate`), as
sglang.bench_serving runs them. Runs on its own event loop; the caller's thread reads
`Progress` and sets the `cancel` event.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from appliance.bench.client import (
    CHAT,
    RequestResult,
    Unreachable,
    model_name,
    reach,
    send,
    server_accept_len,
)
from appliance.bench.metrics import LevelMetrics, level_metrics
from appliance.bench.prompts import Prompt

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)
MODES = ("back_to_back", "interleaved")


class BenchCancelled(Exception):
    pass


class BenchUnreachable(Exception):
    """A target does not answer at all: the run stops before its first level, saying
    which target, at which URL, and the connection error."""

    def __init__(self, target: Target, error: str) -> None:
        super().__init__(f"cannot reach {target.name} at {target.url}: {error}")
        self.target, self.error = target, error


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # base URL, e.g. http://127.0.0.1:30000
    model: str = ""  # empty: the first of /v1/models
    endpoint: str = CHAT
    # The panel's gateway wants a key (Bearer); an engine called directly, none. Never shown:
    # a run's rows keep the targets' names and URLs, not this.
    api_key: str = field(default="", repr=False)


@dataclass(frozen=True)
class BenchOptions:
    levels: tuple[int, ...] = DEFAULT_LEVELS
    warmup: int = 1  # requests before each level, not counted
    request_rate: float | None = None  # requests/s (Poisson); None: all at once
    duration_s: float | None = None  # stop sending new requests after this long per level
    seed: int = 0
    mode: str = "back_to_back"
    timeout_s: float = 600.0  # one request


@dataclass
class Progress:
    step: int = 0  # 1-based index of the running (target, level) step
    steps: int = 0
    target: str = ""
    level: int = 0
    done: int = 0  # requests finished in this step
    total: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"step": self.step, "steps": self.steps, "target": self.target,
                    "level": self.level, "done": self.done, "total": self.total}


@dataclass(frozen=True)
class StepResult:
    target: str
    metrics: LevelMetrics

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, **self.metrics.to_dict()}


@dataclass(frozen=True)
class RunResult:
    steps: list[StepResult]

    def to_dict(self) -> dict[str, Any]:
        return {"levels": [s.to_dict() for s in self.steps]}

    @property
    def failed_requests(self) -> int:
        return sum(s.metrics.errors for s in self.steps)

    @property
    def every_request_failed(self) -> bool:
        return bool(self.steps) and not any(s.metrics.completed for s in self.steps)

    def first_error(self) -> str:
        """The first failed request's error, with where it happened; empty when none."""
        for step in self.steps:
            if step.metrics.first_error:
                return (f"{step.target}, concurrency {step.metrics.concurrency}: "
                        f"{step.metrics.first_error}")
        return ""


def plan_steps(targets: Sequence[Target], levels: Sequence[int],
               mode: str) -> list[tuple[Target, int]]:
    """Back to back: every level of one target, then the next. Interleaved: each level
    against every target in turn, so slow drift (heat, other load) hits all alike."""
    if mode == "interleaved":
        return [(t, level) for level in levels for t in targets]
    return [(t, level) for t in targets for level in levels]


def run_benchmark(targets: Sequence[Target], prompts: Sequence[Prompt], options: BenchOptions,
                  progress: Progress | None = None,
                  cancel: threading.Event | None = None) -> RunResult:
    """Blocking; raises BenchCancelled when `cancel` is set."""
    return asyncio.run(_run(targets, prompts, options, progress or Progress(),
                            cancel or threading.Event()))


async def _run(targets: Sequence[Target], prompts: Sequence[Prompt], options: BenchOptions,
               progress: Progress, cancel: threading.Event) -> RunResult:
    steps = plan_steps(targets, options.levels, options.mode)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=options.timeout_s)
    results = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for target in targets:
            await _reach(session, target)
        models = {t.name: t.model or await model_name(session, t.url) for t in targets}
        for index, (target, level) in enumerate(steps, 1):
            with progress.lock:
                progress.step, progress.steps = index, len(steps)
                progress.target, progress.level = target.name, level
                progress.done, progress.total = 0, len(prompts)
            metrics = await _level(session, target, models[target.name], level, prompts,
                                   options, progress, cancel)
            results.append(StepResult(target.name, metrics))
    return RunResult(results)


async def _reach(session: aiohttp.ClientSession, target: Target) -> None:
    try:
        await reach(session, target.url)
    except Unreachable as exc:
        raise BenchUnreachable(target, str(exc)) from exc


async def _level(session: aiohttp.ClientSession, target: Target, model: str, level: int,
                 prompts: Sequence[Prompt], options: BenchOptions, progress: Progress,
                 cancel: threading.Event) -> LevelMetrics:
    warm = [send(session, target.url, target.endpoint, model, p,
                 api_key=target.api_key)
            for p in prompts[:options.warmup]]
    await asyncio.gather(*warm)
    start = time.perf_counter()
    main = asyncio.create_task(_requests(session, target, model, level, prompts, options,
                                         progress, cancel, start))
    while not main.done():
        await asyncio.wait({main}, timeout=0.2)
        if cancel.is_set():
            main.cancel()
            raise BenchCancelled()
    results = main.result()
    duration = time.perf_counter() - start
    accept = await server_accept_len(session, target.url)
    return level_metrics(concurrency=level, results=results, duration_s=duration,
                         accept_len=accept)


async def _requests(session: aiohttp.ClientSession, target: Target, model: str, level: int,
                    prompts: Sequence[Prompt], options: BenchOptions, progress: Progress,
                    cancel: threading.Event, start: float) -> list[RequestResult]:
    gate = asyncio.Semaphore(level)
    rng = random.Random(options.seed)
    deadline = start + options.duration_s if options.duration_s else None

    async def one(prompt: Prompt) -> RequestResult | None:
        async with gate:
            if deadline is not None and time.perf_counter() > deadline:
                return None
            result = await send(session, target.url, target.endpoint, model, prompt,
                                  api_key=target.api_key)
        with progress.lock:
            progress.done += 1
        return result

    tasks = []
    for i, prompt in enumerate(prompts):
        if i and options.request_rate:
            await asyncio.sleep(rng.expovariate(options.request_rate))
        if cancel.is_set() or (deadline is not None and time.perf_counter() > deadline):
            break
        tasks.append(asyncio.create_task(one(prompt)))
    return [r for r in await asyncio.gather(*tasks) if r is not None]


def verdict_words(ratio: float, baseline: str) -> str:
    """A throughput ratio against the baseline in words: "1.25x faster than base", "2.00x
    slower than base" (the inverse, so half the speed reads as twice as slow), and "as fast
    as base (1.00x)" where either way rounds to 1.00x (never "1.00x slower")."""
    if ratio <= 0:
        return f"produced no output, against {baseline}"
    if "1.00" in (f"{ratio:.2f}", f"{1 / ratio:.2f}"):
        return f"as fast as {baseline} (1.00x)"
    if ratio > 1:
        return f"{ratio:.2f}x faster than {baseline}"
    return f"{1 / ratio:.2f}x slower than {baseline}"


def speedups(result: RunResult, baseline: str) -> list[dict[str, Any]]:
    """Per level and non-baseline target: output-throughput and TPOT ratios against the
    baseline (both > 1 when the target is faster), with a one-line verdict."""
    base = {s.metrics.concurrency: s.metrics for s in result.steps if s.target == baseline}
    rows = []
    for step in result.steps:
        ref, m = base.get(step.metrics.concurrency), step.metrics
        if step.target == baseline or ref is None:
            continue
        thr = m.output_throughput / ref.output_throughput if ref.output_throughput else None
        tpot = ref.tpot_ms.mean / m.tpot_ms.mean if m.tpot_ms.mean else None
        verdict = (f"{step.target} {verdict_words(thr, baseline)} at concurrency "
                   f"{m.concurrency}" if thr is not None else
                   f"{step.target}: no throughput to compare at concurrency {m.concurrency}")
        rows.append({"target": step.target, "baseline": baseline,
                     "concurrency": m.concurrency, "throughput_ratio": thr,
                     "tpot_ratio": tpot, "verdict": verdict})
    return rows


def options_dict(options: BenchOptions) -> dict[str, Any]:
    return asdict(options)
