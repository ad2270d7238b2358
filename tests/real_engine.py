"""Reading the real engine's recordings (tests/fixtures/real-engine, made by the rig
tests/gpu/real-engine.sh on an H200): each run's lines, events, metrics and answers."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from appliance.logs.parser import LogEvent, LogParser
from appliance.runtime.logstream import parse_docker_ts

ROOT = Path(__file__).resolve().parent / "fixtures" / "real-engine"
PINNED = "433c58ed7"
PR_HEAD = "101cd5bd0"
SERVED = ("ddtree_triton", "dflash_triton", "base_triton")
FAILURES = ("missing_model", "kv_too_small", "drafter_hidden_mismatch", "capture_oom",
            "tree_backend_unsupported")


@dataclass(frozen=True)
class Line:
    ts_ns: int
    text: str


def folder(run: str, commit: str = PINNED) -> Path:
    return ROOT / commit / run


def all_runs() -> list[tuple[str, str]]:
    return sorted((p.parent.name, p.name) for p in ROOT.glob("*/*") if (p / "engine.log").exists())


@cache
def lines(run: str, commit: str = PINNED) -> tuple[Line, ...]:
    """The engine's lines as Docker gave them: its timestamp, then the line; tqdm's "\\r"
    redraws stay inside a line (newline="\\n": Python would split on them otherwise)."""
    out = []
    with open(folder(run, commit) / "engine.log", encoding="utf-8", newline="\n") as log:
        for raw in log:
            stamp, _, text = raw.rstrip("\n").partition(" ")
            out.append(Line(parse_docker_ts(stamp), text))
    return tuple(out)


@cache
def events(run: str, commit: str = PINNED) -> tuple[tuple[int, LogEvent], ...]:
    """(index of the line, event) for every event the parser gives, unmatched lines too."""
    parser = LogParser(include_all=True)
    out = [(i, event) for i, line in enumerate(lines(run, commit)) for event in parser.feed(line.text)]
    out += [(len(lines(run, commit)) - 1, event) for event in parser.finish()]
    return tuple(out)


def of_kind(run: str, kind: str, commit: str = PINNED) -> list[dict[str, Any]]:
    return [event.fields for _, event in events(run, commit) if event.kind == kind]


def run_info(run: str, commit: str = PINNED) -> dict[str, Any]:
    return json.loads((folder(run, commit) / "run.json").read_text())


def metrics(run: str) -> list[dict[str, Any]]:
    with gzip.open(folder(run) / "metrics.jsonl.gz", "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def json_file(run: str, name: str) -> Any:
    return json.loads((folder(run) / name).read_text())
