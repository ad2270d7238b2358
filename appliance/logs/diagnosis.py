"""The most likely failure cause of a whole log: parse it, then pick among the causes found."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from appliance.logs.appliance_causes import UNKNOWN_ERROR
from appliance.logs.causes import CAUSES, Diagnosis
from appliance.logs.parser import parse_lines


@dataclass
class _Candidate:
    line: int
    fatal: bool
    priority: int
    diagnosis: Diagnosis


def diagnose(lines: Iterable[str], facts: Mapping[str, Any] | None = None) -> Diagnosis | None:
    """The most likely failure cause of a log.

    A cause found in a fatal traceback wins over warnings seen earlier; among
    fatal ones the most specific wins (an OOM on one rank beats the NCCL errors
    it causes on the others), then the earliest. Without a recognised fatal
    cause the latest warning-level cause wins, then an unrecognised error.
    """
    candidates: list[_Candidate] = []
    last_error: dict[str, Any] | None = None
    for event in parse_lines(lines, facts=facts):
        if event.kind == "error":
            last_error = {"line": event.line, **event.fields}
        elif event.kind == "diagnosis" and event.fields.get("severity"):
            continue  # a finding while running (a note, an engine warning), not a failure
        elif event.kind == "diagnosis":
            found = Diagnosis(
                event.fields["cause"],
                event.fields["summary"],
                event.fields["fix"],
                {**event.fields["evidence"], "line": event.line},
                event.fields.get("patch"),
            )
            priority = CAUSES[found.cause].priority
            candidates.append(_Candidate(event.line, event.fields["fatal"], priority, found))
    return _pick(candidates, last_error)


def _pick(candidates: list[_Candidate], last_error: dict[str, Any] | None) -> Diagnosis | None:
    fatal = [c for c in candidates if c.fatal]
    if fatal:
        return min(fatal, key=lambda c: (-c.priority, c.line)).diagnosis
    if candidates:
        return max(candidates, key=lambda c: (c.line, c.priority)).diagnosis
    if last_error is not None:
        return UNKNOWN_ERROR.worded(
            summary="The engine failed with an error the catalogue does not know: "
                    f"{last_error['message']}",
            fix="Read the traceback (line {}) and the lines before it.".format(
                last_error["line"]),
            evidence={"line": last_error["line"], "message": last_error["message"]},
        )
    return None
