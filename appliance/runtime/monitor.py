"""Watch one engine beside its follower: scrape /metrics, read its GPUs, raise alerts.

The engine agent runs one EngineMonitor thread per engine it follows. Every interval
(2 s by default): while the deployment is ready it scrapes the engine's /metrics,
derives a point (appliance.runtime.series) with the deployment's GPUs read through
NVML, and hands it to the sink; before that it checks for a stall while loading or
capturing. The follower hands it what it ships (observe), for the log-side alerts.
Framework-free: the sink holds the database side.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from appliance.engine.metrics import parse_metrics
from appliance.runtime import gpu_telemetry
from appliance.runtime.alerts import Alert, AlertRules, AlertWatch, Events
from appliance.runtime.client import EngineClient
from appliance.runtime.series import Deriver, MetricPoint

log = logging.getLogger(__name__)


class MonitorSink(Protocol):
    def status(self) -> str: ...

    def engine_url(self) -> str: ...

    def store(self, point: MetricPoint) -> None: ...

    def alerts(self, alerts: list[Alert]) -> None: ...


@dataclass
class MonitorOptions:
    interval_s: float = 2.0
    timeout_s: float = 2.0  # one scrape's limit; a slow engine is an unreachable one
    rules: AlertRules = field(default_factory=AlertRules)


def monitor_options(*, interval_s: float, stall_s: float,
                    disable_cuda_graph: bool = False, drafter: str = "") -> MonitorOptions:
    """A deployment's monitor settings, on every host's agent alike: a
    scrape never waits past the interval (nor 5 s), and an engine deployed with CUDA graphs
    disabled decodes eagerly on purpose (the eager-by-spec note, never the silent-eager
    alert); `drafter`, the spec's, is what the acceptance alert names."""
    rules = AlertRules(stall_s=float(stall_s), expect_cuda_graph=not disable_cuda_graph,
                       drafter=drafter)
    return MonitorOptions(interval_s=interval_s, timeout_s=min(interval_s, 5.0), rules=rules)


GpuReader = Callable[[list[int]], list[list[float | None]]]


class EngineMonitor:
    """One engine's metrics and alerts; run() until `stop` is set."""

    def __init__(
        self,
        sink: MonitorSink,
        *,
        gpus: list[int] | None = None,
        options: MonitorOptions | None = None,
        active_alerts: list[str] | None = None,
        client_factory: Callable[[str, float], EngineClient] | None = None,
        gpu_reader: GpuReader | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.gpus = list(gpus or [])
        self.options = options or MonitorOptions()
        self.client_factory = client_factory or (lambda url, t: EngineClient(url, timeout=t))
        self.gpu_reader = gpu_reader or gpu_telemetry.quick
        self.clock = clock  # a point's time (a replay of a recording passes the recorded one)
        self.deriver = Deriver()
        self.watch = AlertWatch(self.options.rules, active_alerts or [], time.monotonic())
        self.lock = threading.Lock()  # observe() runs on the follower's thread
        self.client: EngineClient | None = None
        self.scrape_s = 0.0  # the last scrape's cost: fetch, parse, derive (bench/ reads it)

    def observe(self, events: Events) -> None:
        """The follower's shipped events (progress, decode lines, diagnoses)."""
        with self.lock:
            raised = self.watch.events(events, time.monotonic())
        self._report(raised)

    def step(self) -> MetricPoint | None:
        """One interval's work: the stall check, then a scrape while ready."""
        status = self.sink.status()
        with self.lock:
            raised = self.watch.tick(status, time.monotonic())
        point = None
        if status == "ready" and self.sink.engine_url():
            point, more = self._scrape()
            raised += more
        self._report(raised)
        return point

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.wait(self._until_next()):
                try:
                    self.step()
                except Exception:  # noqa: BLE001 - the database is back next interval
                    log.exception("engine monitor step failed; trying again")
        finally:
            if self.client is not None:
                self.client.close()

    def _until_next(self) -> float:
        interval = self.options.interval_s
        return interval - (time.monotonic() % interval)  # on the interval's grid, no drift

    def _scrape(self) -> tuple[MetricPoint | None, list[Alert]]:
        started = time.perf_counter()
        try:
            text = self._client().metrics_text()
        except Exception as exc:  # noqa: BLE001 - refused, timed out, 404 without metrics
            if self.client is not None:
                self.client.close()  # a fresh connection next time
            self.client = None
            with self.lock:
                return None, self.watch.scrape_failed(str(exc))
        point = self.deriver.derive(self.clock(), parse_metrics(text), self.gpu_reader(self.gpus))
        self.scrape_s = time.perf_counter() - started
        self.sink.store(point)
        with self.lock:
            return point, self.watch.point(point)

    def _client(self) -> EngineClient:
        url = self.sink.engine_url()
        if self.client is None or self.client.base_url != url.rstrip("/"):
            self.client = self.client_factory(url, self.options.timeout_s)
        return self.client

    def _report(self, raised: list[Alert]) -> None:
        if raised:
            self.sink.alerts(raised)
