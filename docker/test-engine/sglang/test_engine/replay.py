"""Replay mode (TEST_ENGINE_REPLAY): a recording of the real engine, played back.

The recordings in tests/fixtures/real-engine/<commit>/<run>/ (made on an H200 by
tests/gpu/realengine/record.py) are copied into the image at /opt/test-engine/recordings.
A replay prints the run's engine.log lines without their `docker logs -t` stamp (Docker
adds its own), each at its recorded time from the start, on stdout (the recorder merged
stdout and stderr into one stream, so which stream a line came from is not recorded).
Time is compressed: every gap between two lines is divided by TEST_ENGINE_REPLAY_SPEED and
none lasts longer than TEST_ENGINE_REPLAY_MAX_GAP_S, and the /metrics snapshots are placed
on the same compressed clock (`Clock`), so what the engine printed and what it served stay
together. The recorder's own stop (SIGTERM, from "SIGTERM received" on) is not played; a
SIGTERM to the replay prints those lines. A run that ended by itself (a failure) exits with
its recorded status once its last line is printed.
"""

from __future__ import annotations

import bisect
import calendar
import gzip
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang.test_engine.output import emit

RECORDINGS = Path(__file__).resolve().parents[2] / "recordings"
READY_MARK = "The server is fired up and ready to roll"
STOP_MARK = "SIGTERM received"
STAMP_LEN = 30  # "2026-12-01T09:24:51.123456789Z"


def stamp_seconds(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC stamp with nanoseconds, as Docker writes."""
    whole = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    return whole + int(stamp[20:29]) / 1e9


@dataclass(frozen=True)
class Clock:
    """Recorded seconds from the start -> replay seconds: piecewise linear through the log
    lines, each gap divided by the speed and capped; after the last line, speed alone."""

    recorded: list[float]
    played: list[float]
    speed: float

    def play(self, at: float) -> float:
        i = bisect.bisect_right(self.recorded, at) - 1
        if i < 0:
            return 0.0
        if i >= len(self.recorded) - 1:
            return self.played[-1] + (at - self.recorded[-1]) / self.speed
        span = self.recorded[i + 1] - self.recorded[i]
        share = (at - self.recorded[i]) / span if span > 0 else 1.0
        return self.played[i] + share * (self.played[i + 1] - self.played[i])


def make_clock(times: list[float], speed: float, max_gap_s: float) -> Clock:
    """`times`: the recorded offsets of the lines, in order (the start, 0, is added)."""
    recorded, played = [0.0], [0.0]
    for at in times:
        gap = max(at - recorded[-1], 0.0) / speed
        if max_gap_s > 0:
            gap = min(gap, max_gap_s)
        recorded.append(max(at, recorded[-1]))
        played.append(played[-1] + gap)
    return Clock(recorded, played, speed)


@dataclass
class Recording:
    """One run folder: its lines up to the recorder's stop and what it served."""

    folder: Path
    lines: list[tuple[float, str]]
    shutdown: list[str]
    metrics: list[tuple[float, int, str]]
    exit_code: int | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ready_index(self) -> int | None:
        return next((i for i, (_, text) in enumerate(self.lines) if READY_MARK in text), None)

    def json_file(self, name: str) -> Any:
        path = self.folder / name
        if not path.exists():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def sse(self, name: str) -> tuple[dict[str, Any], list[tuple[float, str]]] | None:
        """A raw stream: its status and headers, then (recorded second, bytes) per read."""
        path = self.folder / name
        if not path.exists():
            return None
        rows = [json.loads(row) for row in path.read_text(encoding="utf-8").splitlines() if row]
        head, chunks = rows[0], rows[1:]
        return head, [(stamp_seconds(c["t"]), c["data"]) for c in chunks]


def resolve(name: str) -> Path:
    """A recording folder: an absolute path, or one relative to the image's recordings."""
    path = Path(name)
    folder = path if path.is_absolute() else RECORDINGS / path
    if not (folder / "engine.log").is_file():
        known = sorted(str(log.parent.relative_to(RECORDINGS))
                       for log in RECORDINGS.glob("*/*/engine.log"))
        raise SystemExit(f"TEST_ENGINE_REPLAY={name}: no engine.log in {folder}; "
                         f"recordings here: {', '.join(known) or 'none'}")
    return folder


def read_log(folder: Path) -> list[tuple[float, str]]:
    # Split on "\n" only: tqdm's "\r" redraws stay inside their line, as Docker keeps them.
    with open(folder / "engine.log", encoding="utf-8", newline="\n") as log:
        rows = [row.rstrip("\n") for row in log]
    return [(stamp_seconds(row[:STAMP_LEN]), row[STAMP_LEN + 1:]) for row in rows if row]


def read_metrics(folder: Path) -> list[tuple[float, str, int, str]]:
    path = folder / "metrics.jsonl.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as rows:
        snaps = [json.loads(row) for row in rows if row.strip()]
    return [(stamp_seconds(s["t"]), s["phase"], int(s["status"]), s["text"]) for s in snaps]


def load(folder: Path) -> Recording:
    lines = read_log(folder)
    metrics = read_metrics(folder)
    start = min([lines[0][0]] + [m[0] for m in metrics[:1]])
    stop = next((i for i, (_, text) in enumerate(lines) if STOP_MARK in text), len(lines))
    stop_at = lines[stop][0] if stop < len(lines) else float("inf")
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    return Recording(
        folder=folder,
        lines=[(at - start, text) for at, text in lines[:stop]],
        shutdown=[text for _, text in lines[stop:]],
        # The recorder's "stopping" scrapes are of an engine it was killing.
        metrics=[(at - start, status, text) for at, phase, status, text in metrics
                 if phase != "stopping" and at < stop_at],
        exit_code=run.get("exited_by_itself"),
        extra={"start": start, "run": run},
    )


class Replay:
    """The playback: prints the lines on time, knows the replay clock and readiness."""

    def __init__(self, recording: Recording, speed: float, max_gap_s: float) -> None:
        self.recording = recording
        self.speed = speed
        self.max_gap_s = max_gap_s
        self.clock = make_clock([at for at, _ in recording.lines], speed, max_gap_s)
        self.metric_times = [self.clock.play(at) for at, _, _ in recording.metrics]
        self.started = time.monotonic()
        self.ready = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.started

    def play_time_of_gap(self, recorded_gap_s: float) -> float:
        """A recorded gap (between two streamed chunks) on the replay's clock."""
        gap = recorded_gap_s / self.speed
        return min(gap, self.max_gap_s) if self.max_gap_s > 0 else gap

    def run(self) -> None:
        ready = self.recording.ready_index
        for i, (at, text) in enumerate(self.recording.lines):
            delay = self.clock.play(at) - self.now()
            if delay > 0:
                time.sleep(delay)
            emit(sys.stdout, text + "\n")
            if i == ready:
                self.ready.set()
        code = self.recording.exit_code
        if code is not None:
            sys.stdout.flush()
            os._exit(code if code >= 0 else 128 - code)  # -9 reads as 137, as Docker says

    def metrics(self) -> tuple[int, str] | None:
        """The snapshot the engine was serving at this moment of the replay (after the last
        one, the last one); None before the first scrape."""
        i = bisect.bisect_right(self.metric_times, self.now()) - 1
        if i < 0:
            return None
        _, status, text = self.recording.metrics[i]
        return status, text

    def shut_down(self) -> None:
        for text in self.recording.shutdown:
            emit(sys.stdout, text + "\n")
