"""The agent's log shipping with the encoding on the follower's thread: the shipper's write of
one batch and the encoding of the next run side by side, and what is handed while a write
runs reaches the panel as one batch, in order, as the ingest takes it (host kinds, the
engine key masked, the row's progress and decode stats the latest).

A real HTTP server stands for the panel's ingest; it holds its first answer until the
follower (this test's thread) has handed the batches that follow."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance import collector
from appliance.events import KV_CACHE
from appliance.runtime.container_plan import Identity
from appliance.runtime.cursor import Cursor
from appliance.runtime.follow_threads import Events, Shipper
from appliance.runtime.host_sink import RemoteSink, Shipment
from appliance.runtime.panel_link import PanelLink
from tests.appliance.runtime.panel_stub import panel_server

ROOT = Path(__file__).resolve().parents[3]
KEY = "engine-key-0123456789"


class Panel:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []  # the ingest's
        self.others: list[str] = []  # paths of the other calls (the quiet one on close)
        self.first_taken = threading.Event()
        self.answer_first = threading.Event()


@pytest.fixture
def panel() -> Iterator[tuple[Panel, str]]:
    state = Panel()

    def answer(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        if not path.endswith("/events/"):
            state.others.append(path)
        else:
            state.bodies.append(body)
        if len(state.bodies) == 1 and not state.first_taken.is_set():
            state.first_taken.set()
            state.answer_first.wait(10)
        return 200, json.dumps({"last_seq": len(state.bodies), "stored": True}).encode()

    with panel_server(answer) as url:
        try:
            yield state, url
        finally:
            state.answer_first.set()  # a held answer never holds the server's shutdown


class Agent:
    def __init__(self, url: str) -> None:
        self.link = PanelLink(url, "host-credential", timeout_s=5)

    def credential_refused(self, exc: Exception) -> None:
        raise AssertionError(exc)


class ThreadNoted(RemoteSink):
    """The sink as shipped, noting the thread each of its two halves runs on."""

    encoded_on: list[int]
    shipped_on: list[int]

    def encode(self, events: Events) -> Shipment:
        self.encoded_on.append(threading.get_ident())
        return super().encode(events)

    def ship_encoded(self, shipments: list[Shipment], cursor: Cursor | None) -> None:
        self.shipped_on.append(threading.get_ident())
        super().ship_encoded(shipments, cursor)


def _sink(url: str) -> ThreadNoted:
    placement = {"id": 7, "start_token": "t" * 32, "status": "loading", "engine_key": KEY,
                 "progress": {"phase": "loading"}, "log_cursor": ""}
    sink = ThreadNoted(placement, Agent(url), threading.Event(),  # type: ignore[arg-type]
                       Identity("7"))
    sink.encoded_on, sink.shipped_on = [], []
    return sink


def _decode(n: int) -> tuple[str, dict[str, Any]]:
    return ("metric", {"kind": "decode_stats", "line": n, "gen_throughput": 100.0 + n})


def test_batches_handed_during_a_write_are_encoded_on_the_follower_and_shipped_as_one(
        panel: tuple[Panel, str]) -> None:
    state, url = panel
    sink = _sink(url)
    shipper = Shipper(sink)
    shipper.start()
    try:
        shipper.ship([("log", {"stream": "stdout", "text": "first"}), _decode(1)],
                     Cursor(1_000, 1))
        assert state.first_taken.wait(10)  # the first write is under way, unanswered
        shipper.ship([("log", {"stream": "stderr", "text": f"--api-key {KEY}"}),
                      ("progress", {"kind": KV_CACHE, "tokens": 123_456}),
                      _decode(2)], Cursor(2_000, 1))
        shipper.ship([("status", {"message": "engine container x running"}),
                      ("log", {"stream": "stdout", "text": "third"})], Cursor(3_000, 1))
        state.answer_first.set()
        shipper.flush()
    finally:
        shipper.close()

    follower = threading.get_ident()
    assert sink.encoded_on == [follower] * 3
    assert len(sink.shipped_on) == 2 and follower not in sink.shipped_on
    first, rest = state.bodies
    assert state.others == ["/api/fleet/host/deployments/7/quiet/"]
    assert [e[1].get("text") for e in first["events"]] == ["first", None]
    assert first["row"]["decode_stats"]["line"] == 1 and "progress" not in first["row"]
    # The two handed during the first write: one batch, in the order handed, the key masked
    # and the follower's own note as the log line the entrypoint prints.
    assert [kind for kind, _ in rest["events"]] == ["log", "progress", "metric", "log", "log"]
    assert [e[1].get("text") for e in rest["events"]] == [
        "--api-key ***", None, None, "appliance: engine container x running", "third"]
    assert rest["row"]["decode_stats"]["line"] == 2  # the last decode stats handed
    assert rest["row"]["progress"]["kv_cache_tokens"] == 123_456
    assert rest["row"]["log_cursor"] == Cursor(3_000, 1).encode()
    assert rest["after"] == first["row"]["log_cursor"] == Cursor(1_000, 1).encode()
    assert KEY not in json.dumps(state.bodies)


def test_a_sink_that_does_not_encode_gets_the_handed_events_joined_in_order() -> None:
    got: list[tuple[Events, Cursor | None]] = []

    class Plain:
        def ship(self, events: Events, cursor: Cursor | None) -> None:
            got.append((events, cursor))

        def idle(self) -> None:
            return None

    shipper = Shipper(Plain())  # type: ignore[arg-type]
    assert shipper.encoding is None
    with shipper.changed:  # hold the shipper until both are handed
        shipper.ship([("log", {"text": "a"})], None)
        shipper.ship([("log", {"text": "b"})], Cursor(5, 1))
        shipper.start()
    shipper.flush()
    shipper.close()
    assert got == [([("log", {"text": "a"}), ("log", {"text": "b"})], Cursor(5, 1))]


def test_the_collector_is_settled_by_the_panel_and_the_agent_as_they_start() -> None:
    """The panel's ASGI module and the agent's entry point settle the collector
    (appliance/collector.py) before they serve: young passes spaced out, the start frozen."""
    settled = (f"(gc.get_threshold()[0] == {collector.YOUNG_OBJECTS} and "
               "gc.get_freeze_count() > 1000) or sys.exit('not settled: %s %s' % "
               "(gc.get_threshold(), gc.get_freeze_count()))")
    panel = subprocess.run(
        [sys.executable, "-c", f"import gc, sys; import web.asgi; {settled}"], cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "web.settings",
             "APPLIANCE_SECRET_KEY": "k" * 64},
        capture_output=True, text=True, timeout=60, check=False)
    assert panel.returncode == 0, panel.stderr[-2000:]
    # The agent's main, up to where it would start following (its run stubbed out).
    agent = subprocess.run(
        [sys.executable, "-c",
         "import gc, sys; import worker.agent as a; a.remote_agent_run_forever = lambda s: 0\n"
         f"try:\n    a.main()\nexcept SystemExit:\n    {settled}"], cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "APPLIANCE_PANEL_URL": "http://127.0.0.1:9"},
        capture_output=True, text=True, timeout=60, check=False)
    assert agent.returncode == 0, agent.stderr[-2000:]
