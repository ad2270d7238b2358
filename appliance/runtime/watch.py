"""Start an engine container and watch it until it is ready, fails, or is stopped.

Framework-free: the caller passes a sink that stores events and moves the
deployment's status. Phase detection is the log parser's; readiness is
`/health` turning 200 while the container is watched for an early exit, with
a deadline, then a one-token generation (DESIGN.md, style 9).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from appliance.logs.causes import Diagnosis
from appliance.logs.diagnosis import diagnose
from appliance.logs.parser import LogEvent, LogParser
from appliance.runtime.client import EngineClient
from appliance.runtime.containers import ContainerPlan, EngineRuntime, LogLine

# Parser kinds that move the deployment forward, and the status each means.
PHASE_OF_KIND = {
    "selfcheck_start": "checking",
    "selfcheck_begin": "checking",
    "weights_begin": "loading",
    "weights_progress": "loading",
    "capture_begin": "capturing",
    "capture_progress": "capturing",
}
PROGRESS_KINDS = frozenset(
    {
        "weights_begin",
        "weights_progress",
        "weights_end",
        "kv_cache",
        "capture_begin",
        "capture_progress",
        "capture_end",
        "ready",
    }
)
PHASE_ORDER = ("starting", "checking", "loading", "capturing", "ready")
LAST_LINES = 60


class WatchSink(Protocol):
    def emit(self, events: list[tuple[str, dict[str, Any]]]) -> None: ...

    def advance(self, status: str) -> bool: ...

    def stop_requested(self) -> bool: ...


@dataclass
class WatchResult:
    outcome: str  # ready | failed | stopped
    message: str = ""
    diagnosis: Diagnosis | None = None
    exit_code: int | None = None
    last_lines: list[str] = field(default_factory=list)
    engine_url: str = ""


@dataclass
class WatchOptions:
    ready_timeout_s: float = 3600.0
    health_poll_s: float = 1.0
    batch_s: float = 0.2
    health_timeout_s: float = 5.0


class _Follower(threading.Thread):
    """Reads container output on its own thread so health polling never waits on it."""

    def __init__(self, lines: Iterator[LogLine]) -> None:
        super().__init__(daemon=True, name="engine-log-follower")
        self.lines = lines
        self.queue: queue.Queue[LogLine | None] = queue.Queue()

    def run(self) -> None:
        try:
            for line in self.lines:
                self.queue.put(line)
        finally:
            self.queue.put(None)


class EngineWatch:
    """One watch of one engine container; call run() once."""

    def __init__(
        self,
        runtime: EngineRuntime,
        plan: ContainerPlan,
        sink: WatchSink,
        options: WatchOptions | None = None,
        client_factory: Callable[[str], EngineClient] | None = None,
    ) -> None:
        self.runtime = runtime
        self.plan = plan
        self.sink = sink
        self.options = options or WatchOptions()
        self.client_factory = client_factory or (lambda url: EngineClient(url, timeout=5.0))
        self.parser = LogParser()
        self.progress_parser = LogParser()  # for unfinished progress-bar pieces only
        self.tail: deque[str] = deque(maxlen=LAST_LINES)
        self.all_lines: deque[str] = deque(maxlen=2000)
        self.status = "starting"
        self.saw_ready_line = False
        self.stream_ended = False

    def run(self, since: float | None = None) -> WatchResult:
        """Start (or adopt) the container and watch it; `since` skips output already shipped."""
        container = self.runtime.ensure_started(self.plan)
        url = self.runtime.engine_url(container, self.plan)
        self.sink.emit([("status", {"message": f"engine container {container.name} running"})])
        # Live pieces of "\r" progress bars make shard and batch progress move as it happens;
        # they come only from an attach, which cannot resume, so not when adopting.
        lines = self.runtime.follow_logs(container, since=since, partials=since is None)
        follower = _Follower(lines)
        follower.start()
        result = self._loop(container, follower, self.client_factory(url))
        result.engine_url = url
        return result

    def _loop(self, container: Any, follower: _Follower, client: EngineClient) -> WatchResult:
        deadline = time.monotonic() + self.options.ready_timeout_s
        next_health = 0.0
        while True:
            self._drain(follower)
            if self.sink.stop_requested():
                return WatchResult("stopped", "stop requested", last_lines=list(self.tail))
            exited = self._exit_code(container)
            if exited is not None:
                self._drain_rest(follower)
                return self._failed_exit(exited)
            now = time.monotonic()
            if now >= next_health:
                next_health = now + self.options.health_poll_s
                if client.health() == 200:
                    self._drain(follower)
                    return self._confirm_ready(container, follower, client)
            if now > deadline:
                return self._failed(
                    "engine-timeout",
                    f"the engine was not ready within {self.options.ready_timeout_s:.0f} s",
                )

    def _drain(self, follower: _Follower) -> None:
        """Take what the follower read in the last batch window and ship it as one batch."""
        batch: list[LogLine] = []
        until = time.monotonic() + self.options.batch_s
        while time.monotonic() < until and len(batch) < 500:
            try:
                item = follower.queue.get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                self.stream_ended = True
                break
            batch.append(item)
        if batch:
            self._ship(batch)

    def _drain_rest(self, follower: _Follower) -> None:
        follower.join(timeout=5.0)
        batch: list[LogLine] = []
        while True:
            try:
                item = follower.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                batch.append(item)
        events: list[tuple[str, dict[str, Any]]] = []
        if batch:
            events.extend(self._events_for(batch))
        events.extend(self._parsed(self.parser.finish()))
        if events:
            self.sink.emit(events)

    def _ship(self, batch: list[LogLine]) -> None:
        self.sink.emit(self._events_for(batch))

    def _events_for(self, batch: list[LogLine]) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        for line in batch:
            if line.partial:
                events.extend(self._partial_progress(line.text))
                continue
            shown = line.text.rsplit("\r", 1)[-1] if "\r" in line.text else line.text
            self.tail.append(shown)
            self.all_lines.append(line.text)
            events.append(("log", {"stream": line.stream, "text": shown}))
            events.extend(self._parsed(self.parser.feed(line.text)))
        return events

    def _partial_progress(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        events = []
        for event in self.progress_parser.feed(text):
            if event.kind in {"weights_progress", "capture_progress"}:
                payload = event.to_dict()
                payload["partial"] = True
                events.append(("progress", payload))
                self._advance_for(event.kind)
        return events

    def _parsed(self, parsed: list[LogEvent]) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        for event in parsed:
            payload = event.to_dict()
            if event.kind in PROGRESS_KINDS:
                events.append(("progress", payload))
            elif event.kind in {"decode_stats", "prefill_stats"}:
                events.append(("metric", payload))
            elif event.kind == "diagnosis":
                events.append(("diagnosis", payload))
            elif event.kind.startswith("selfcheck_"):
                events.append(("selfcheck", payload))
            if event.kind == "ready":
                self.saw_ready_line = True
            self._advance_for(event.kind)
        return events

    def _advance_for(self, kind: str) -> None:
        wanted = PHASE_OF_KIND.get(kind)
        if (wanted and PHASE_ORDER.index(wanted) > PHASE_ORDER.index(self.status)
                and self.sink.advance(wanted)):
            self.status = wanted

    def _exit_code(self, container: Any) -> int | None:
        state, code = self.runtime.state(container)
        if state in {"exited", "dead"}:
            return code if code is not None else -1
        return None

    def _confirm_ready(
        self, container: Any, follower: _Follower, client: EngineClient
    ) -> WatchResult:
        try:
            client.generate_one_token()
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is a failed deployment
            # An engine that crashes on its first generation prints why as it dies.
            code = self._wait_exit(container, 10.0)
            self._drain_rest(follower) if code is not None else self._drain(follower)
            return self._failed(
                "generation-failed", f"/health was 200 but a one-token generation failed: {exc}"
            )
        if self.sink.advance("ready"):
            self.status = "ready"
        return WatchResult("ready", "engine is ready", last_lines=list(self.tail))

    def _wait_exit(self, container: Any, limit_s: float) -> int | None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            code = self._exit_code(container)
            if code is not None:
                return code
            time.sleep(0.2)
        return None

    def _failed_exit(self, code: int) -> WatchResult:
        found = diagnose(list(self.all_lines))
        if found is not None and found.cause == "gpu-selfcheck-failed":
            message = f"the GPU self-check failed (exit code {code}); the model was not loaded"
        else:
            message = f"the engine container exited with code {code} before it was ready"
        return self._failed("engine-exited", message, code, found)

    def _failed(
        self, cause: str, message: str, code: int | None = None, found: Diagnosis | None = None
    ) -> WatchResult:
        """A failed result; `found` is the log's diagnosis when the caller already has it."""
        found = found or diagnose(list(self.all_lines)) or Diagnosis(
            cause=cause,
            summary=message,
            fix="Read the engine's last lines below; the cause was not recognised.",
            evidence={"exit_code": code},
        )
        return WatchResult(
            "failed",
            message,
            diagnosis=found,
            exit_code=code,
            last_lines=list(self.tail),
        )


def lines_between(container: Any, since: float, until: float) -> list[LogLine]:
    """A running container's output written in [since, until), stdout then stderr.

    The supervisor ships a ready engine's output in ticks with this, so no task
    has to hold a follower open for the engine's whole lifetime.
    """
    lines: list[LogLine] = []
    for stream in ("stdout", "stderr"):
        raw = container.logs(
            stdout=stream == "stdout",
            stderr=stream == "stderr",
            since=since,
            until=until,
            timestamps=False,
        )
        text = raw.decode("utf-8", errors="replace")
        lines.extend(LogLine(stream, part) for part in text.split("\n") if part)  # type: ignore[arg-type]
    return lines


@dataclass
class TickResult:
    events: list[tuple[str, dict[str, Any]]]
    exited: bool
    exit_code: int | None
    diagnosis: Diagnosis | None
    last_lines: list[str]


def supervise_tick(
    runtime: EngineRuntime, deployment_id: str, since: float, until: float, history: list[str]
) -> TickResult:
    """One reconcile step for a ready engine: new output as events, and whether it died.

    `history` is the engine's recent output (for a diagnosis when it exits).
    """
    container = runtime.find(deployment_id)
    if container is None:
        gone = Diagnosis("engine-vanished", "the engine container is gone",
                         "Redeploy; check `docker ps -a` for who removed it.", {})
        return TickResult([], True, None, gone, history[-LAST_LINES:])
    parser = LogParser()
    events: list[tuple[str, dict[str, Any]]] = []
    lines = lines_between(container, since, until)
    for line in lines:
        events.append(("log", {"stream": line.stream, "text": line.text}))
        for event in parser.feed(line.text):
            kind = "metric" if event.kind in {"decode_stats", "prefill_stats"} else None
            if event.kind == "diagnosis":
                kind = "diagnosis"
            if kind:
                events.append((kind, event.to_dict()))
    state, code = runtime.state(container)
    if state not in {"exited", "dead"}:
        return TickResult(events, False, None, None, [])
    recent = history + [line.text for line in lines]
    found = diagnose(recent) or Diagnosis(
        "engine-exited", f"the engine exited with code {code} while serving",
        "Read the engine's last lines below.", {"exit_code": code})
    return TickResult(events, True, code, found, recent[-LAST_LINES:])
