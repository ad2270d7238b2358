"""A fleet host's batches: under the panel's body limit, in order, the engine key masked."""

from __future__ import annotations

import json

from appliance.runtime.remote_agent import MAX_BATCH_BYTES, batches, host_kinds, masked


def test_a_large_batch_is_split_under_512_kib_in_order() -> None:
    events = [("log", {"stream": "stdout", "text": f"{i:06d} " + "x" * 900}) for i in range(2000)]
    parts = batches(events)
    assert len(parts) > 1 and [e for p in parts for e in p] == events
    for part in parts:
        body = json.dumps({"events": [[k, p] for k, p in part], "row": {}},
                          separators=(",", ":"))
        assert len(body.encode()) < MAX_BATCH_BYTES + 1024


def test_a_small_batch_stays_whole() -> None:
    events = [("log", {"text": "one"}), ("metric", {"kind": "decode_stats"})]
    assert batches(events) == [events]


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
