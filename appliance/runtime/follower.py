"""Follow one engine container for its whole life: output, phases, readiness, exit.

The engine agent runs one EngineFollower per engine it owns. It starts (or adopts) the
container, reads its stdout and stderr with Docker's timestamps from a stored cursor,
parses every line, and hands the events to a sink in batches together with the cursor of
the last line in the batch; the sink stores both in one transaction, so a follower that
dies and a new one that resumes from the stored cursor ship every line exactly once.
Readiness is `/health` turning 200 (the container watched for an early exit, with a
deadline), then a one-token generation; the follower keeps following after ready, with no
gap. Framework-free: the sink holds the database side.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.events import (
    BAR_KINDS,
    CAPTURE_BEGIN,
    CAPTURE_PROGRESS,
    DIAGNOSIS,
    LOG,
    METRIC,
    PARSED_DIAGNOSIS,
    PROGRESS,
    PROGRESS_KINDS,
    SELFCHECK,
    SELFCHECK_BEGIN,
    SELFCHECK_START,
    STATS_KINDS,
    STATUS,
    WEIGHTS_BEGIN,
    WEIGHTS_PROGRESS,
)
from appliance.lifecycle import ENGINE_PHASES, Status
from appliance.logs.appliance_causes import (
    ENGINE_EXITED,
    ENGINE_OOM_KILLED,
    ENGINE_TIMEOUT,
    ENGINE_VANISHED,
    GENERATION_FAILED,
    exit_diagnosis,
    exit_message,
)
from appliance.logs.cause import Cause
from appliance.logs.causes import Diagnosis
from appliance.logs.diagnosis import diagnose
from appliance.logs.parser import LogEvent, LogParser
from appliance.runtime.client import EngineClient
from appliance.runtime.container_plan import ContainerPlan
from appliance.runtime.containers import EngineRuntime, LogLine
from appliance.runtime.cursor import Cursor, CursorFilter
from appliance.runtime.follow_threads import (
    LINGER_EVENTS,
    LINGER_S,
    Events,
    FollowOptions,
    FollowSink,
    HealthPoller,
    LineReader,
    Shipper,
)

# Parser kinds that move the deployment forward, and the engine phase each means.
PHASE_OF_KIND = {
    SELFCHECK_START: Status.CHECKING,
    SELFCHECK_BEGIN: Status.CHECKING,
    WEIGHTS_BEGIN: Status.LOADING,
    WEIGHTS_PROGRESS: Status.LOADING,
    CAPTURE_BEGIN: Status.CAPTURING,
    CAPTURE_PROGRESS: Status.CAPTURING,
}
PHASE_ORDER: tuple[str, ...] = ENGINE_PHASES  # the agent's moves, appliance.lifecycle
LAST_LINES = 60

# uvicorn's access line for a /metrics scrape (the agent's own, every 2 s, and any
# Prometheus'): not stored, or it would be most of a quiet engine's log.
SCRAPE_ACCESS = re.compile(r'^INFO:\s+\S+ - "GET /metrics HTTP/1\.[01]" 200\b')


@dataclass
class _State:
    status: str = "starting"
    cursor: Cursor = field(default_factory=Cursor)
    ended: bool = False


class EngineFollower:
    """One engine's follower; run() returns when the engine ended or following must stop."""

    def __init__(
        self,
        runtime: EngineRuntime,
        plan: ContainerPlan,
        sink: FollowSink,
        *,
        status: str = "starting",
        cursor: Cursor | None = None,
        may_start: bool = True,
        options: FollowOptions | None = None,
        client_factory: Callable[[str], EngineClient] | None = None,
        needed_widths: Mapping[str, int] | None = None,
        facts: Mapping[str, Any] | None = None,
    ) -> None:
        self.runtime = runtime
        self.plan = plan
        self.sink = sink
        self.may_start = may_start
        self.options = options or FollowOptions()
        self.client_factory = client_factory or (lambda url: EngineClient(url, timeout=5.0))
        self.state = _State(status=status, cursor=cursor or Cursor())
        # The graph widths the spec needs per role: a capture at another width is a finding.
        # What the spec says (appliance.logs.facts.spec_facts): the causes quote its values.
        self.facts = dict(facts or {})
        self.parser = LogParser(needed_widths=needed_widths, facts=self.facts)
        self.progress_parser = LogParser()  # for unfinished progress-bar pieces only
        self.tail: deque[str] = deque(maxlen=LAST_LINES)
        self.all_lines: deque[str] = deque(maxlen=2000)
        self.outcome = ""
        self.shipper: Shipper | None = None
        self.last_drain = 0.0

    def _ship(self, events: Events, cursor: Cursor | None) -> None:
        if self.shipper is None:
            self.sink.ship(events, cursor)
        else:
            self.shipper.ship(events, cursor)

    def _flush(self) -> bool:
        """Everything handed to the shipper is stored before the sink is asked anything else
        (True: a condition flushes before it asks)."""
        if self.shipper is not None:
            self.shipper.flush()
        return True

    # ------------------------------------------------------------------ the loop

    def run(self) -> str:
        """Follow until the engine exits (failed), following must stop, or the stream ends."""
        self.shipper = Shipper(self.sink)
        self.shipper.start()
        try:
            outcome = self._follow()
            self._flush()
            return outcome
        finally:
            shipper, self.shipper = self.shipper, None
            shipper.close()  # ships what is still queued (none after a failed ship)

    def _follow(self) -> str:
        container = self._container()
        if container is None:
            return self.outcome
        health = HealthPoller(lambda: self._client(container), self.options.health_poll_s)
        try:
            return self._follow_output(container, health)
        finally:
            health.stopped.set()

    def _follow_output(self, container: Any, health: HealthPoller) -> str:
        deadline = time.monotonic() + self.options.ready_timeout_s
        reader, partials = self._readers(container)
        while True:
            self._drain(reader, partials)
            if not self.sink.keep_following():
                return self._end("released")
            if self.state.ended:
                reader, partials = self._after_stream_end(container, reader)
                if reader is None:
                    return self.outcome
                continue
            if self.state.status != "ready":
                if health.ident is None:  # not started yet: an adopted ready engine needs none
                    health.start()
                if health.healthy.is_set() and health.client is not None:
                    self._confirm_ready(container, reader, health.client)
                    if partials is not None:
                        # No bar is drawn once the engine serves, and that stream would be
                        # read, line by line, for as long as it does.
                        partials.end()
                        partials = None
                elif time.monotonic() > deadline:
                    return self._fail(None, ENGINE_TIMEOUT, "the engine was not ready within "
                                      f"{self.options.ready_timeout_s:.0f} s")

    def _container(self) -> Any:
        if self.may_start and self.state.status == "starting":
            container = self.runtime.ensure_started(self.plan)
            self._ship([(STATUS, {"message": f"engine container {container.name} "  # StatusNote
                                             "running"})], None)
            return container
        container = self.runtime.find(self.plan.identity)
        if container is None:
            self._fail(None, ENGINE_VANISHED, "the engine container is gone")
        return container

    def _readers(self, container: Any) -> tuple[LineReader, LineReader | None]:
        cursor = self.state.cursor
        reader = LineReader(self._lines_after(container, cursor), "engine-log-reader")
        reader.start()
        partials = None
        if self.options.partials and self.state.status != "ready" and not cursor.ts_ns:
            # Docker hands out a line only once its "\n" arrives; an attach shows a tqdm
            # bar's pieces as they are drawn, for live progress only (never stored as lines).
            partials = LineReader(self.runtime.follow_logs(container, partials=True),
                               "engine-progress-reader", keep=lambda line: line.partial)
            partials.start()
        return reader, partials

    def _lines_after(self, container: Any, cursor: Cursor) -> Iterator[LogLine]:
        """Every line after `cursor` until the follow ends. Docker 20.10's follow can end at
        an engine's exit short of its last lines (684 of 10,001 lost on a loaded machine, CI
        2026-12-07): once the engine has exited, _read_rest reads the stored log for them."""
        keep = CursorFilter(cursor)
        lines = self.runtime.follow_logs(container, since=cursor.since(), timestamps=True)
        return (line for line in lines if keep.new(line))

    def _stored_after(self, container: Any, cursor: Cursor) -> Iterator[LogLine]:
        """The lines Docker has stored after `cursor`, up to now."""
        keep = CursorFilter(cursor)
        for line in self.runtime.follow_logs(container, since=cursor.since(), timestamps=True,
                                             follow=False):
            if keep.new(line):
                yield line

    def _read_rest(self, container: Any) -> None:
        """Once the engine has exited, what its stored log holds after the cursor (Docker
        has stored all it printed by then): a follow that ended short of it left the rest."""
        self.state.ended = False
        reader = LineReader(self._stored_after(container, self.state.cursor), "engine-log-rest")
        reader.start()
        while not self.state.ended:
            self._drain(reader, None)

    def _after_stream_end(self, container: Any, reader: LineReader) -> tuple[Any, Any]:
        """The log stream ended: the engine exited, or Docker went away for a moment."""
        state = self.runtime.exit_state(container)
        if state.get("status") in {"exited", "dead"}:
            self._read_rest(container)
            self._exited(state)
            return None, None
        if state.get("status") == "missing":
            self._fail(None, ENGINE_VANISHED, "the engine container is gone")
            return None, None
        time.sleep(1.0)  # dockerd restarting, or a broken stream: resume from the cursor
        self.state.ended = False
        return self._readers(container)

    def _client(self, container: Any) -> EngineClient | None:
        try:
            return self.client_factory(self.runtime.engine_url(container, self.plan))
        except Exception:  # noqa: BLE001 - no port yet, or the engine exited: look again later
            return None

    # ------------------------------------------------------------------ output

    def _drain(self, reader: LineReader, partials: LineReader | None) -> None:
        """Take what arrived in one batch window and ship it with its cursor."""
        # Wait up to batch_s for a first line, then take what is already there: a quiet
        # engine's line ships at once, and a busy one's batches grow while a write runs.
        taken = reader.take(self.options.batch_lines, self.options.batch_s)
        if taken and len(taken) < LINGER_EVENTS and taken[-1] is not None:
            # A trickle is taken at most every LINGER_S (see there): parsing and handing
            # over a line at a time cost more than the lines (profiled).
            left = self.last_drain + LINGER_S - time.monotonic()
            if left > 0:
                time.sleep(left)
                taken += reader.take(self.options.batch_lines - len(taken), None)
        self.last_drain = time.monotonic()
        batch: list[LogLine] = []
        for item in taken:
            if item is None:
                self.state.ended = True
                break
            batch.append(item)
        events = self._pieces(partials) if partials is not None else []
        if batch:
            events.extend(self._events_for(batch))
            self.state.cursor = self.state.cursor.advance_all(batch)
            if self.state.ended:
                events.extend(self._parsed(self.parser.finish()))
        if events:
            self._ship(events, self.state.cursor if batch else None)

    def _pieces(self, partials: LineReader) -> Events:
        events: Events = []
        for item in partials.take(1_000_000, None):
            if item is not None and self.state.status != "ready":
                events.extend(self._partial_progress(item.text))
        return events

    def _events_for(self, batch: list[LogLine]) -> Events:
        events: Events = []
        append, extend, feed, parsed = events.append, events.extend, self.parser.feed, self._parsed
        for line in batch:
            text = line.text
            if text[:5] == "INFO:" and SCRAPE_ACCESS.match(text):
                continue
            shown = text.rsplit("\r", 1)[-1] if "\r" in text else text
            self.tail.append(shown)
            self.all_lines.append(text)
            append((LOG, {"stream": line.stream, "text": shown}))  # a LogLine
            found = feed(text)
            if found:
                extend(parsed(found))
        return events

    def _partial_progress(self, text: str) -> Events:
        # A bar's pieces show progress only and never move the phase: they come on a
        # stream of their own, so a capture bar's piece can arrive before the weight lines
        # printed ahead of it, and moving on it would skip `loading`. The lines move the
        # phase: the engine prints each phase's begin line before its bar (the recordings).
        return [(PROGRESS, {**event.to_dict(), "partial": True})
                for event in self.progress_parser.feed(text) if event.kind in BAR_KINDS]

    def _parsed(self, parsed: list[LogEvent]) -> Events:
        events: Events = []
        for event in parsed:
            payload = event.to_dict()
            if event.kind in PROGRESS_KINDS:
                events.append((PROGRESS, payload))
            elif event.kind in STATS_KINDS:
                events.append((METRIC, payload))
            elif event.kind == PARSED_DIAGNOSIS:
                events.append((DIAGNOSIS, payload))
            elif event.kind.startswith("selfcheck_"):
                events.append((SELFCHECK, payload))
            self._advance_for(event.kind)
        return events

    def _advance_for(self, kind: str) -> None:
        wanted = PHASE_OF_KIND.get(kind)
        if (wanted and self.state.status in PHASE_ORDER
                and PHASE_ORDER.index(wanted) > PHASE_ORDER.index(self.state.status)
                and self._flush() and self.sink.advance(wanted)):
            self.state.status = wanted

    # ------------------------------------------------------------------ readiness and ends

    def _confirm_ready(self, container: Any, reader: LineReader, client: EngineClient) -> None:
        try:
            client.generate_one_token()
        except Exception as exc:  # noqa: BLE001 - any failure of the probe fails the deployment
            # An engine that crashes on its first generation prints why as it dies.
            self._wait_exit(container, reader, 10.0)
            self._fail(None, GENERATION_FAILED,
                       f"/health was 200 but a one-token generation failed: {exc}")
            raise _Done() from None
        self._flush()
        self.sink.ready(client.base_url)
        self.state.status = "ready"

    def _wait_exit(self, container: Any, reader: LineReader, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not self.state.ended:
            self._drain(reader, None)

    def _exited(self, state: dict[str, Any]) -> None:
        code = state.get("exit_code")
        found = diagnose(list(self.all_lines), self.facts)
        when = "while serving" if self.state.status == "ready" else "before it was ready"
        if found is not None and found.cause == "gpu-selfcheck-failed":
            message = f"the GPU self-check failed (exit code {code}); the model was not loaded"
        elif state.get("oom_killed"):
            message = f"the engine was killed for lack of host memory (OOM) {when}"
            found = found or ENGINE_OOM_KILLED.worded(summary=message,
                                                      evidence={"exit_code": code})
        else:
            message = exit_message(code, when)
            found = found or exit_diagnosis(code, message, {"exit_code": code, **state})
        self._fail(found, ENGINE_EXITED, message, evidence={"exit_code": code, **state})

    def _fail(self, found: Diagnosis | None, cause: Cause, message: str, *,
              evidence: dict[str, Any] | None = None) -> str:
        found = found or diagnose(list(self.all_lines), self.facts) or cause.worded(
            summary=message, evidence=evidence)
        self._flush()
        self.sink.failed(found, message, list(self.tail))
        return self._end("failed")

    def _end(self, outcome: str) -> str:
        self.outcome = outcome
        return outcome


class _Done(Exception):
    """The follower's work is over (a failure was already reported)."""


def follow(follower: EngineFollower) -> str:
    """Run a follower; a failure reported from deep inside ends it cleanly."""
    try:
        return follower.run()
    except _Done:
        return follower.outcome
