"""A fleet host's batches: under the panel's body limit, in order, the engine key masked."""

from __future__ import annotations

import json

import pytest

from appliance.runtime.cursor import Cursor
from appliance.runtime.host_sink import (
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    batches,
    cursor_marked,
    host_kinds,
    masked,
)
from appliance.runtime.panel_link import event_json, events_body
from web.fleet.hostwrites import MAX_BATCH_EVENTS as PANEL_MAX_BATCH_EVENTS


def test_a_large_batch_is_split_under_the_byte_limit_in_order() -> None:
    events = [("log", {"stream": "stdout", "text": f"{i:06d} " + "x" * 900}) for i in range(4000)]
    parts = batches(events)
    assert len(parts) > 1 and [e for p in parts for e in p.events] == events
    for part in parts:
        body = events_body(part.encoded, row={}, start_token="t" * 32, after="")
        assert len(body) < MAX_BATCH_BYTES + 1024
        # The body is what json.dumps makes of the same batch, byte for byte.
        assert json.loads(body) == {"events": [[k, p] for k, p in part.events], "row": {},
                                    "start_token": "t" * 32, "after": ""}


def test_many_small_events_are_split_under_the_ingests_event_limit_in_order() -> None:
    """Small events reach the ingest's count (web/fleet/hostwrites.py) before its bytes."""
    assert MAX_BATCH_EVENTS <= PANEL_MAX_BATCH_EVENTS
    events = [("log", {"text": ""}) for _ in range(2 * MAX_BATCH_EVENTS + 1)]
    parts = batches(events)
    assert [len(part.events) for part in parts] == [MAX_BATCH_EVENTS, MAX_BATCH_EVENTS, 1]
    assert all(len(events_body(p.encoded, row={})) < MAX_BATCH_BYTES for p in parts)
    assert [e for p in parts for e in p.events] == events


def test_a_small_batch_stays_whole() -> None:
    events = [("log", {"text": "one"}), ("metric", {"kind": "decode_stats"})]
    assert [part.events for part in batches(events)] == [events]


@pytest.mark.parametrize("event", [
    ("log", {"stream": "stderr", "text": 'quote " backslash \\ tab \t é \u2028 😀 \x00'}),
    ("log", {"text": "no stream"}),
    ("log", {"stream": "stdout", "text": "x", "extra": 1}),
    ("metric", {"kind": "decode_stats", "accept_len": 3.21, "cuda_graph": True, "tp": None}),
    ("build", {"kind": "build_step", "text": "ünïcode"}),
])
def test_each_event_is_encoded_as_compact_utf8_json(event) -> None:  # type: ignore[no-untyped-def]
    kind, payload = event
    text = event_json(kind, payload)
    # json.dumps's compact UTF-8 form, byte for byte: its length is its size in the body.
    assert text == json.dumps([kind, payload], separators=(",", ":"),
                              ensure_ascii=False).encode()
    assert json.loads(text) == [kind, payload]


@pytest.mark.parametrize("event", [
    ("log", {"stream": "stdout", "text": "a lone surrogate \ud800 has no UTF-8"}),
    ("metric", {"kind": "decode_stats", "ranks": {0: 1.5, 1: 2.5}}),
    ("metric", {"kind": "decode_stats", "tokens": 2 ** 70}),
])
def test_an_event_the_fast_encoder_refuses_is_encoded_by_the_standard_library(event) -> None:  # type: ignore[no-untyped-def]
    kind, payload = event
    text = event_json(kind, payload)
    assert text == json.dumps([kind, payload], separators=(",", ":")).encode()
    body = events_body([text, event_json("log", {"text": "é"})], row={})
    assert json.loads(body)["events"][1] == ["log", {"text": "é"}]


def test_a_batch_that_moves_no_line_marks_the_cursor_and_the_follower_reads_past_it() -> None:
    assert cursor_marked("") == "#1"
    assert cursor_marked("1767225600000000000:3") == "1767225600000000000:3#1"
    assert cursor_marked("1767225600000000000:3#1") == "1767225600000000000:3#2"
    assert Cursor.decode("1767225600000000000:3#2") == Cursor(1767225600000000000, 3)
    assert Cursor.decode("#4") == Cursor()


def test_the_engine_key_is_masked_in_every_text() -> None:
    key = "a1b2c3d4" * 8
    line = f"server_args=ServerArgs(port=30000, api_key='{key}', admin_api_key=None)"
    [(kind, payload), untouched] = masked([("log", {"stream": "stderr", "text": line}),
                                           ("metric", {"kind": "decode_stats"})], key)
    assert kind == "log" and payload["text"].endswith("api_key='***', admin_api_key=None)")
    assert payload["stream"] == "stderr" and untouched == ("metric", {"kind": "decode_stats"})


def test_the_followers_own_notes_go_as_appliance_log_lines() -> None:
    assert host_kinds([("status", {"message": "engine container x running"})]) == [
        ("log", {"stream": "stdout", "text": "appliance: engine container x running"})]
