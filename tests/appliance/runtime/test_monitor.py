"""Tests for appliance.runtime.monitor: scrape while ready, stall checks before, alerts
handed to the sink (no database: a list sink; no engine: a client that answers text)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from appliance.runtime.alerts import Alert, AlertRules
from appliance.runtime.client import EngineClientError
from appliance.runtime.monitor import EngineMonitor, MonitorOptions, monitor_options
from appliance.runtime.series import MetricPoint

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"


class ListSink:
    def __init__(self, status: str = "ready") -> None:
        self.state = status
        self.url = "http://engine:30000"
        self.points: list[MetricPoint] = []
        self.raised: list[Alert] = []

    def status(self) -> str:
        return self.state

    def engine_url(self) -> str:
        return self.url

    def store(self, point: MetricPoint) -> None:
        self.points.append(point)

    def alerts(self, alerts: list[Alert]) -> None:
        self.raised.extend(alerts)


class FakeClient:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.base_url = "http://engine:30000"
        self.calls = 0

    def metrics_text(self) -> str:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    def close(self) -> None:
        pass


def _monitor(sink: ListSink, client: FakeClient, **rules: Any) -> EngineMonitor:
    return EngineMonitor(sink, gpus=[0, 1], options=MonitorOptions(rules=AlertRules(**rules)),
                         client_factory=lambda url, timeout: client,  # type: ignore[arg-type,return-value]
                         gpu_reader=lambda indices: [[90.0, 100.0, 143.8] for _ in indices])


def test_a_ready_engine_is_scraped_into_a_point_with_its_gpus() -> None:
    sink = ListSink("ready")
    client = FakeClient([(FIXTURE / "sglang_0523_dflash_tp8.txt").read_text()])
    point = _monitor(sink, client).step()
    assert point is not None and sink.points == [point]
    assert point.accept_len == 4.87 and point.gpus == [[90.0, 100.0, 143.8]] * 2


def test_an_engine_still_loading_is_not_scraped() -> None:
    sink = ListSink("loading")
    client = FakeClient(["unused"])
    assert _monitor(sink, client).step() is None
    assert client.calls == 0 and sink.points == []


def test_three_failed_scrapes_raise_one_unreachable_alert() -> None:
    sink = ListSink("ready")
    client = FakeClient([EngineClientError("GET /metrics answered 404: Not Found")])
    monitor = _monitor(sink, client, unreachable_after=3)
    for _ in range(5):
        monitor.step()
    assert [(a.id, a.state) for a in sink.raised] == [("metrics-unreachable", "firing")]


def test_the_followers_events_reach_the_alerts() -> None:
    sink = ListSink("ready")
    monitor = _monitor(sink, FakeClient([""]))
    monitor.observe([("diagnosis", {"cause": "silent-eager-verify", "summary": "eager",
                                    "fix": "fix it"})])
    assert [(a.id, a.state) for a in sink.raised] == [("silent-eager", "firing")]


def test_run_steps_every_interval_until_stopped() -> None:
    sink = ListSink("ready")
    client = FakeClient([(FIXTURE / "sglang_0523_dflash_tp8.txt").read_text()])
    monitor = _monitor(sink, client)
    monitor.options.interval_s = 0.05
    stop = threading.Event()
    thread = threading.Thread(target=monitor.run, args=(stop,))
    thread.start()
    threading.Event().wait(0.4)
    stop.set()
    thread.join(2)
    assert not thread.is_alive() and 3 <= len(sink.points) <= 10


def test_the_follower_keeps_scrape_access_lines_out_of_the_log() -> None:
    from appliance.runtime.container_plan import ContainerPlan
    from appliance.runtime.containers import EngineRuntime
    from appliance.runtime.follower import EngineFollower
    from appliance.runtime.logstream import LogLine

    follower = EngineFollower(EngineRuntime.__new__(EngineRuntime),
                              ContainerPlan(deployment_id="1", image="x", argv=[]),
                              sink=None, status="ready")  # type: ignore[arg-type]
    lines = [LogLine("stdout", 'INFO:     172.17.0.1:55838 - "GET /metrics HTTP/1.1" 200 OK'),
             LogLine("stdout", 'INFO:     172.17.0.1:55838 - "GET /health HTTP/1.1" 200 OK'),
             LogLine("stderr", "[2026-11-30 02:36:34 TP0] Decode batch, #running-req: 2, "
                               "#token: 526, token usage: 0.00, cuda graph: True, "
                               "gen throughput (token/s): 199.20, #queue-req: 0")]
    events = follower._events_for(lines)
    texts = [p["text"] for kind, p in events if kind == "log"]
    assert texts == [lines[1].text, lines[2].text]
    assert any(kind == "metric" for kind, _ in events)


def test_monitor_options_cap_a_scrape_at_the_interval_and_5_s_and_follow_the_spec() -> None:
    quick = monitor_options(interval_s=2.0, stall_s=300)
    assert (quick.interval_s, quick.timeout_s, quick.rules.stall_s) == (2.0, 2.0, 300.0)
    assert quick.rules.expect_cuda_graph
    slow = monitor_options(interval_s=30.0, stall_s=60, disable_cuda_graph=True)
    assert (slow.timeout_s, slow.rules.stall_s) == (5.0, 60.0)
    assert not slow.rules.expect_cuda_graph  # eager on purpose: no silent-eager alert
