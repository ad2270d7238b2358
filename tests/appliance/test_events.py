"""The event kinds (appliance/events.py) say what the parser really writes: every event the
parser makes of the recordings has a kind listed there, the keys its type requires, and no
key its type does not name; a stored payload of version 1 reads as it is."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest

from appliance import events
from appliance.logs.parser import LogParser
from appliance.runtime.alerts import Alert
from tests import real_engine as rec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The parser's own kinds, never shipped: an exception's lines (the diagnosis carries it),
# a line that matched nothing (parse-log --all).
UNSHIPPED = {events.ERROR, events.LINE}


def _types() -> dict[str, type]:
    """Each parser kind's stored TypedDict, found by its `kind` literal."""
    found: dict[str, type] = {}
    for member in typing.get_args(events.EngineEvent):
        kind = typing.get_args(typing.get_type_hints(member)["kind"])[0]
        found[kind] = member
    return found


def _parsed() -> list[dict[str, Any]]:
    payloads: list[dict[str, Any]] = []
    logs = [*sorted((FIXTURES / "logs").glob("*.log")),
            *sorted((FIXTURES / "selfcheck").glob("*.stream"))]
    for path in logs:
        parser = LogParser()
        with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
            for line in handle:
                payloads += [e.to_dict() for e in parser.feed(line)]
        payloads += [e.to_dict() for e in parser.finish()]
    for commit, run in rec.all_runs():
        payloads += [event.to_dict() for _, event in rec.events(run, commit)]
    return [p for p in payloads if p["kind"] not in UNSHIPPED]


def test_the_typed_kinds_are_the_listed_engine_kinds() -> None:
    assert set(_types()) == events.ENGINE_KINDS
    assert events.PROGRESS_KINDS | events.STATS_KINDS <= events.ENGINE_KINDS
    assert events.BAR_KINDS <= events.PROGRESS_KINDS


def test_every_event_the_parser_makes_of_the_recordings_has_the_keys_its_kind_says() -> None:
    types = _types()
    parsed = _parsed()
    seen = {payload["kind"] for payload in parsed}
    # The recordings hold a whole load, capture, serve and self-check: most kinds are in them.
    assert {events.WEIGHTS_BEGIN, events.WEIGHTS_END, events.KV_CACHE, events.CAPTURE_BEGIN,
            events.CAPTURE_END, events.DECODE_STATS, events.READY, events.SELFCHECK_REPORT,
            events.PARSED_DIAGNOSIS} <= seen
    wrong = []
    for payload in parsed:
        kind = payload["kind"]
        assert kind in types, f"{kind} is not a kind appliance/events.py lists"
        typed = types[kind]
        keys = set(payload)
        missing = typed.__required_keys__ - keys  # type: ignore[attr-defined]
        unknown = keys - typed.__required_keys__ - typed.__optional_keys__  # type: ignore[attr-defined]
        if missing or unknown:
            wrong.append((kind, sorted(missing), sorted(unknown)))
    assert not wrong, sorted(set(map(str, wrong)))[:10]


def test_a_stored_payload_without_a_version_is_version_one_and_reads_as_it_is() -> None:
    stored = {"line": 7, "kind": "capture_progress", "bs": 64, "done": 3, "total": 52,
              "avail_mem_gb": 70.5, "tp": 0}
    event = events.engine_event(stored)
    assert event == stored and event["kind"] == events.CAPTURE_PROGRESS


@pytest.mark.parametrize(("payload", "says"), [
    ({"kind": "capture_progress", "v": 2}, "version 2"),
    ({"kind": "graph_reloaded"}, "'graph_reloaded' is not a parser kind"),
])
def test_a_payload_of_an_unknown_version_or_kind_is_refused_by_name(
        payload: dict[str, Any], says: str) -> None:
    with pytest.raises(events.UnknownEvent, match=says):
        events.engine_event(payload)


def test_an_alert_has_the_keys_the_alert_type_names() -> None:
    alert = Alert("stall", "firing", "warning", "No progress for 300 s.", "read the log",
                  {"quiet_s": 300.0})
    assert set(alert.to_dict()) == events.Alert.__required_keys__
    assert events.AlertPayload.__required_keys__ == events.Alert.__required_keys__ | {
        "raised_at"}
