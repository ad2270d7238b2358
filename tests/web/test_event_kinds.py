"""The Event rows' kinds are appliance.events' stored kinds, and web reads the parser's
payloads through it (a payload of a kind it does not fold changes nothing)."""

from __future__ import annotations

from appliance import events
from web.agent.engines import FOLDED_KINDS, progress_fold
from web.deployments.models import EventKind


def test_the_event_rows_kinds_are_the_stored_kinds_appliance_events_lists() -> None:
    assert {kind.value for kind in EventKind} == events.STORED_KINDS


def test_the_folded_kinds_are_parser_kinds_and_others_leave_the_progress_as_it_was() -> None:
    assert FOLDED_KINDS <= events.ENGINE_KINDS
    progress = {"weights": {"done": 3, "total": 12, "finished": False}}
    assert not progress_fold(progress, {"line": 9, "kind": "decode_stats", "running_req": 1})
    assert not progress_fold(progress, {"kind": "graph_reloaded"})
    assert progress == {"weights": {"done": 3, "total": 12, "finished": False}}
