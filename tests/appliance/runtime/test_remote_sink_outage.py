"""A joined host's writes across a panel that is away (restarting behind its proxy): the log
follower waits for it rather than ending (its end ends the engine's monitor, and the points
that monitor kept), and the monitor's kept points all reach the panel at their own times.

A real HTTP server stands for the panel and its proxy (503 while "web" is down, as HAProxy
answers); the outage's 31 s pass on a fake clock that the sink's waits advance."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from appliance.runtime.container_plan import Identity
from appliance.runtime.host_sink import (
    MONITOR_SEND_POINTS,
    PANEL_AWAY_S,
    SHIP_TRIES,
    RemoteMonitorSink,
    RemoteSink,
)
from appliance.runtime.panel_link import PanelLink, PanelRefused
from appliance.runtime.series import MetricPoint
from tests.appliance.runtime.panel_stub import panel_server

OUTAGE_S = 31.0  # the restart of web, worker and agent seen on the trial


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class FakeStop(threading.Event):
    """The follower's stop: waiting on it advances the fake clock instead of sleeping."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0.0
        return self.is_set()


@dataclass
class Panel:
    """What the panel took (200) and how many calls its proxy answered `status` to."""

    clock: Clock
    down_until: float = OUTAGE_S
    status: int = 503
    taken: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refused: int = 0


@pytest.fixture
def panel() -> Iterator[tuple[Panel, str]]:
    state = Panel(Clock())

    def answer(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        if state.clock.now < state.down_until:
            state.refused += 1
            return state.status, b"<html>503 Service Unavailable</html>"
        state.taken.append((path, body))
        return 200, json.dumps({"last_seq": len(state.taken),
                                "stored": len(body.get("points") or [])}).encode()

    with panel_server(answer) as url:
        yield state, url


class Agent:
    def __init__(self, url: str) -> None:
        self.link = PanelLink(url, "host-credential", timeout_s=5)
        self.refused: PanelRefused | None = None

    def credential_refused(self, exc: PanelRefused) -> None:
        self.refused = exc


def _sink(state: Panel, url: str) -> RemoteSink:
    placement = {"id": 7, "start_token": "t" * 32, "status": "ready",
                 "engine_url": "http://10.0.0.9:30000"}
    sink = RemoteSink(placement, Agent(url), FakeStop(state.clock),  # type: ignore[arg-type]
                      Identity("7"))
    sink.clock = state.clock
    return sink


def test_a_batch_shipped_while_the_proxy_answers_503_is_taken_once_the_panel_is_back(
        panel: tuple[Panel, str]) -> None:
    state, url = panel
    sink = _sink(state, url)
    sink.ship([("log", {"stream": "stdout", "text": "decode batch"})], None)
    assert state.clock.now >= OUTAGE_S and state.refused >= SHIP_TRIES
    assert [path for path, _ in state.taken] == ["/api/fleet/host/deployments/7/events/"]
    assert not sink.stop.is_set()  # the follower, and the monitor it runs, go on


def test_a_panel_refusing_connections_is_waited_for_too(panel: tuple[Panel, str]) -> None:
    state, url = panel
    sink = _sink(state, "http://127.0.0.1:9")  # nothing listens: the panel's port closed
    stop = sink.stop
    assert isinstance(stop, FakeStop)

    def wait(timeout: float | None = None) -> bool:
        FakeStop.wait(stop, timeout)
        if state.clock.now >= OUTAGE_S:
            sink.agent.link.panel_url = url  # web is back
        return stop.is_set()

    stop.wait = wait  # type: ignore[method-assign]
    assert sink.advance("ready") is False  # the test panel's answer has no "moved"
    assert state.clock.now >= OUTAGE_S
    assert [path for path, _ in state.taken] == ["/api/fleet/host/deployments/7/steps/"]


def test_a_panel_away_past_the_bound_or_another_5xx_ends_the_wait(
        panel: tuple[Panel, str]) -> None:
    state, url = panel
    state.down_until = PANEL_AWAY_S * 2
    with pytest.raises(PanelRefused) as away:
        _sink(state, url).ship([("log", {"text": "x"})], None)
    assert away.value.status == 503 and PANEL_AWAY_S <= state.clock.now < PANEL_AWAY_S + 10
    state.clock.now, state.refused, state.status = 0.0, 0, 500
    with pytest.raises(PanelRefused) as broken:
        _sink(state, url).ship([("log", {"text": "x"})], None)
    assert broken.value.status == 500 and state.refused == SHIP_TRIES


def test_the_monitor_keeps_every_point_of_a_long_outage_and_sends_them_at_their_times(
        panel: tuple[Panel, str]) -> None:
    state, url = panel
    state.down_until = 100.0  # longer than one report's worth of points at 2 s
    monitor = RemoteMonitorSink(_sink(state, url))
    sampled = [1000.0 + 2 * i for i in range(52)]
    for i, t in enumerate(sampled):
        state.clock.now = 2.0 * i
        monitor.store(MetricPoint(t=t, throughput=float(i)))
    assert state.clock.now > state.down_until and len(state.taken) >= 2
    reports = [body for path, body in state.taken
               if path == "/api/fleet/host/deployments/7/metrics/"]
    assert all(len(r["points"]) <= MONITOR_SEND_POINTS for r in reports)
    assert [p["t"] for r in reports for p in r["points"]] == sampled
    assert not monitor.points


def test_a_panel_that_answers_nothing_never_holds_the_monitor_past_its_next_scrape(
        panel: tuple[Panel, str]) -> None:
    """web stopped: its address takes the connection and answers nothing until the link's
    timeout. Each store returns within its wait, the points are kept and all go once the
    panel answers again."""
    state, url = panel
    state.down_until = 0.0  # the test server answers at once once the link points at it
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the kernel; nothing is ever read or answered
    try:
        sink = _sink(state, f"http://127.0.0.1:{silent.getsockname()[1]}")
        sink.agent.link.timeout_s = 3.0
        monitor = RemoteMonitorSink(sink, wait_s=0.2)
        sampled = [2000.0 + 2 * i for i in range(6)]
        for i, t in enumerate(sampled[:5]):
            started = time.monotonic()
            monitor.store(MetricPoint(t=t, throughput=float(i)))
            assert time.monotonic() - started < 1.0, "the monitor waited on the panel"
        assert state.taken == [] and len(monitor.points) == 5
        sink.agent.link.panel_url = url  # web is back
        held = monitor.sending
        assert held is not None
        held.join(5)  # the held report ends at the link's timeout, kept for the next
        monitor.store(MetricPoint(t=sampled[5], throughput=5.0))
        deadline = time.monotonic() + 5
        while monitor.points and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p["t"] for _, body in state.taken for p in body["points"]] == sampled
    finally:
        silent.close()
