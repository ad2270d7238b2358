"""One Tune: each candidate in turn pre-flighted, deployed (by the caller's `Deployer`),
checked lossless against the baseline, and benchmarked at each concurrency through the
benchmark client (appliance.bench), within a time budget; then the deployment restored.

The restore runs whatever ends the run (done, a cancel, the budget spent, an error): the
`Deployer` puts back what it took. Runs on the caller's thread; another thread reads
`TuneProgress` and sets `cancel`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from appliance.bench.lossless import NEAR_TIE_GAP
from appliance.bench.prompts import Prompt
from appliance.bench.runner import (
    BenchCancelled,
    BenchOptions,
    BenchUnreachable,
    Progress,
    Target,
    run_benchmark,
)
from appliance.bench.verify_api import VerifyError
from appliance.tune.candidates import BASELINE, Candidate
from appliance.tune.lossless import check_candidate, record_baseline
from appliance.tune.recommend import recommend

WATCH_S = 0.2


class TuneCancelled(Exception):
    pass


class DeployFailed(Exception):
    """A candidate that did not come up (its engine failed, or not in time): skipped, said."""


class Deployer(Protocol):
    def preflight(self, candidate: Candidate) -> list[str]:
        """Pre-flight's errors for the candidate's spec (each with its fix); none: fine."""

    def deploy(self, candidate: Candidate, stop: Callable[[], bool]) -> str:
        """Run the candidate in the deployment's place; its engine's base URL once it
        serves. Raises DeployFailed; returns early (any URL) when `stop()` says so."""

    def restore(self) -> str:
        """Put the deployment back as it was; what was done, in words. Raises on failure."""


@dataclass(frozen=True)
class TuneOptions:
    levels: tuple[int, ...] = (1, 8, 32)
    warmup: int = 2
    time_budget_s: float = 3600.0
    lossless_max_tokens: int = 32
    threshold: float = NEAR_TIE_GAP
    seed: int = 0


@dataclass
class TuneProgress:
    candidate: str = ""
    index: int = 0  # 1-based, of `count`
    count: int = 0
    phase: str = "starting"  # preflight, deploying, lossless, benchmark, restoring, ended
    level: int = 0
    done: int = 0  # requests finished at this level
    total: int = 0
    deadline: float = 0.0  # Unix time the budget ends
    states: dict[str, str] = field(default_factory=dict)
    bench: Progress = field(default_factory=Progress)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def set(self, **values: Any) -> None:
        with self.lock:
            for key, value in values.items():
                setattr(self, key, value)

    def snapshot(self) -> dict[str, Any]:
        bench = self.bench.snapshot()
        with self.lock:
            return {"candidate": self.candidate, "index": self.index, "count": self.count,
                    "phase": self.phase, "level": bench["level"] or self.level,
                    "done": bench["done"] if self.phase == "benchmark" else self.done,
                    "total": bench["total"] if self.phase == "benchmark" else self.total,
                    "deadline": self.deadline,
                    "time_left_s": max(0.0, round(self.deadline - time.time(), 1)),
                    "states": dict(self.states)}


@dataclass
class TuneResult:
    candidates: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    ended: str  # done | cancelled | out_of_time | failed
    reason: str
    restore: dict[str, Any]
    recommendation: dict[str, Any]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "rows": self.rows, "ended": self.ended,
                "reason": self.reason, "restore": self.restore,
                "recommendation": self.recommendation, "seconds": round(self.seconds, 1)}


class _Stop:
    """Set by the caller's cancel or once the budget is spent, whichever is first; a thread
    watches both so that a level under way ends within WATCH_S."""

    def __init__(self, cancel: threading.Event, deadline: float) -> None:
        self.cancel, self.deadline = cancel, deadline
        self.event = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="tune-watch")
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(WATCH_S):
            if self.cancel.is_set() or time.time() >= self.deadline:
                self.event.set()
                return

    def __call__(self) -> bool:
        return self.event.is_set() or self.cancel.is_set() or time.time() >= self.deadline

    def why(self) -> str:
        return "cancelled" if self.cancel.is_set() else "out_of_time"

    def close(self) -> None:
        self.done.set()


def run_tune(candidates: Sequence[Candidate], deployer: Deployer, prompts: Sequence[Prompt],
             lossless_prompts: Sequence[str], options: TuneOptions,
             progress: TuneProgress | None = None,
             cancel: threading.Event | None = None) -> TuneResult:
    """Blocking. The baseline runs first wherever it is in `candidates`."""
    progress = progress or TuneProgress()
    cancel = cancel or threading.Event()
    begun = time.time()
    ordered = sorted(candidates, key=lambda c: c.name != BASELINE)
    records = [{**c.to_dict(), "state": "waiting", "findings": [], "error": "",
                "lossless": None} for c in ordered]
    rows: list[dict[str, Any]] = []
    progress.set(count=len(ordered), deadline=begun + options.time_budget_s,
                 states={c.name: "waiting" for c in ordered})
    stop = _Stop(cancel, begun + options.time_budget_s)
    ended, reason = "done", ""
    try:
        baseline: list[dict[str, Any]] | None = None
        for index, (candidate, record) in enumerate(zip(ordered, records, strict=True), 1):
            if stop():
                raise TuneCancelled()
            progress.set(candidate=candidate.name, index=index)
            baseline = _one(candidate, record, rows, deployer, prompts, lossless_prompts,
                            options, progress, stop, baseline)
    except (TuneCancelled, BenchCancelled):
        ended = stop.why()
        reason = ("cancelled by the operator" if ended == "cancelled" else
                  f"the time budget of {options.time_budget_s:g} s ran out")
        current = progress.snapshot()["candidate"]
        reason += f" during {current}" if current else ""
    except Exception:  # the run failed; the deployment is restored all the same
        ended, reason = "failed", traceback.format_exc()[-3000:]
    finally:
        stop.close()
        for record in records:
            if record["state"] in ("waiting", "deploying", "checking", "measuring"):
                record["state"] = "not run" if record["state"] == "waiting" else "stopped"
        progress.set(phase="restoring", states={r["name"]: r["state"] for r in records})
        restore = _restore(deployer)
        progress.set(phase="ended")
    return TuneResult(records, rows, ended, reason, restore, recommend(records, rows),
                      time.time() - begun)


def _restore(deployer: Deployer) -> dict[str, Any]:
    try:
        return {"ok": True, "message": deployer.restore()}
    except Exception as exc:  # said on the run: the operator must act
        return {"ok": False, "message": f"the deployment could not be restored: {exc}"}


def _state(progress: TuneProgress, record: dict[str, Any], state: str, phase: str) -> None:
    record["state"] = state
    with progress.lock:
        progress.phase = phase
        progress.states[record["name"]] = state
        progress.level = 0


def _one(candidate: Candidate, record: dict[str, Any], rows: list[dict[str, Any]],
         deployer: Deployer, prompts: Sequence[Prompt], lossless_prompts: Sequence[str],
         options: TuneOptions, progress: TuneProgress, stop: _Stop,
         baseline: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """One candidate, start to end; the baseline's answers (recorded when it is the
    baseline)."""
    _state(progress, record, "preflight", "preflight")
    findings = deployer.preflight(candidate)
    if findings:
        record["findings"] = findings
        _state(progress, record, "skipped", "preflight")
        return baseline
    _state(progress, record, "deploying", "deploying")
    try:
        url = deployer.deploy(candidate, stop)
    except DeployFailed as exc:
        record["error"] = str(exc)
        _state(progress, record, "failed", "deploying")
        return baseline
    if stop():
        raise TuneCancelled()
    record["url"] = url
    _state(progress, record, "checking", "lossless")
    progress.set(done=0, total=len(lossless_prompts))
    try:
        if candidate.name == BASELINE:
            baseline = asyncio.run(record_baseline(
                url, lossless_prompts, max_tokens=options.lossless_max_tokens, stop=stop))
            record["lossless"] = {"passed": True, "baseline": True,
                                  "total": len(baseline)}
        elif baseline is None:
            record["lossless"] = {"passed": None, "error": "not checked: the baseline (no "
                                  "speculation) was not measured, so nothing to check against"}
        else:
            record["lossless"] = asyncio.run(check_candidate(
                url, lossless_prompts, baseline, max_tokens=options.lossless_max_tokens,
                threshold=options.threshold, stop=stop))
    except VerifyError as exc:
        record["lossless"] = {"passed": False, "error": str(exc)}
    if stop():
        raise TuneCancelled()
    _state(progress, record, "measuring", "benchmark")
    for level in options.levels:
        if stop():
            raise TuneCancelled()
        bench = BenchOptions(levels=(level,), warmup=options.warmup, seed=options.seed)
        try:
            result = run_benchmark([Target(candidate.name, url)], prompts, bench,
                                   progress.bench, stop.event)
        except BenchUnreachable as exc:
            record["error"] = str(exc)
            _state(progress, record, "failed", "benchmark")
            return baseline
        for step in result.steps:
            rows.append({"candidate": candidate.name, **step.to_dict()})
    _state(progress, record, "measured", "benchmark")
    return baseline
