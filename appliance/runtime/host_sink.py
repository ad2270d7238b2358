"""What a host agent sends the panel for one followed engine: the follower's events through
the host API's ingest (RemoteSink: in batches under the panel's body limit, each following
the row's log cursor, the engine key masked in every text) and its status steps, and the
engine monitor's points and alerts (RemoteMonitorSink)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests

from appliance.engine.spec import spec_from_dict
from appliance.lifecycle import Status
from appliance.logs.causes import Diagnosis
from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.alerts import Alert
from appliance.runtime.container_plan import Identity
from appliance.runtime.cursor import Cursor
from appliance.runtime.follow_threads import Events
from appliance.runtime.monitor import EngineMonitor, monitor_options
from appliance.runtime.panel_link import (
    PanelLink,
    PanelRefused,
    event_json,
    events_body,
)
from appliance.runtime.progress import progress_fold
from appliance.runtime.series import MetricPoint

log = logging.getLogger(__name__)

# A body under the panel's limits (1 MiB, APPLIANCE_MAX_BODY_BYTES; 20,000 events), with
# room for the row's fields: a busy engine's requests, each with its fixed cost (the host's
# checks, a round trip), half as many as at 512 KiB, and 10,000 decode lines/s were stored
# as they came (docs/performance.md, Log path).
MAX_BATCH_BYTES = 960 * 1024
MAX_BATCH_EVENTS = 10_000
SHIP_TRIES = 5  # a batch the panel refused with another 5xx is sent again, then the follower
# starts over. A panel that is away (no connection, a timeout, the proxy's 502/503/504 while
# web restarts) is waited for instead, up to PANEL_AWAY_S: the follower, and with it the
# engine's monitor and the points it keeps, outlives a panel restart or upgrade.
PANEL_AWAY_S = 600.0
PANEL_AWAY_STATUSES = frozenset({502, 503, 504})
MASK = "***"
# Kept while the panel does not answer: PANEL_AWAY_S of points at the default 2 s interval,
# sent in reports of MONITOR_SEND_POINTS (the most one report may carry: web/fleet/services.py's
# MAX_POINTS), and the latest alert changes (MAX_ALERTS).
MONITOR_KEEP_POINTS = 300
MONITOR_SEND_POINTS = 30
MONITOR_KEEP_ALERTS = 20
COMPACT_EVERY_S = 60.0  # the panel merges the series' old points this often (monitoring.py's)


class SinkAgent(Protocol):
    """What the sinks use of their agent (appliance.runtime.remote_agent.RemoteAgent)."""

    link: PanelLink
    # The starts whose failure the panel took: never followed again (RemoteSink.failed).
    failed_starts: set[tuple[int, str]]

    def credential_refused(self, exc: PanelRefused) -> None: ...

    def engine_stop(self, identity: Identity) -> None: ...


@dataclass
class Batch:
    """Events in order and each one's JSON (panel_link.event_json), made once: its length
    sizes the batch and the text goes into the body (events_body)."""

    events: Events = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)

    @classmethod
    def of(cls, events: Events) -> Batch:
        """The events with each one's JSON, made here, once."""
        return cls(events, [event_json(kind, payload) for kind, payload in events])

    def split(self, limit: int = MAX_BATCH_BYTES,
              most: int = MAX_BATCH_EVENTS) -> list[Batch]:
        """The events in order, in batches whose JSON stays under `limit` bytes, of `most`
        events at most."""
        sizes = [len(text) + 1 for text in self.encoded]  # and its comma
        if sum(sizes) <= limit and len(sizes) <= most:
            return [self]
        out: list[Batch] = []
        first = size = 0
        for i, cost in enumerate(sizes):
            if i > first and (size + cost > limit or i - first >= most):
                out.append(Batch(self.events[first:i], self.encoded[first:i]))
                first, size = i, 0
            size += cost
        out.append(Batch(self.events[first:], self.encoded[first:]))
        return out


def batches(events: Events, limit: int = MAX_BATCH_BYTES,
            most: int = MAX_BATCH_EVENTS) -> list[Batch]:
    """The events in order, in batches whose JSON stays under `limit` bytes, of `most`
    events at most."""
    return Batch.of(events).split(limit, most)


@dataclass
class Shipment:
    """Events made ready for the ingest (RemoteSink.encode), on the follower's thread."""

    followed: Events  # as the follower handed them: the engine's monitor reads these
    batch: Batch  # as the ingest takes them: host kinds, the engine key masked, encoded
    progress: dict[str, Any] | None  # the row's progress after them, where they moved it
    decode: dict[str, Any] | None  # the last decode stats among them


def cursor_marked(cursor: str) -> str:
    """The log cursor a batch that moves no line on sets: the row's cursor with a count of
    such batches after it (`<cursor>#<n>`), so each batch moves the row's cursor and one
    sent again is known (Cursor.decode reads the line position only)."""
    base, _, count = cursor.partition("#")
    return f"{base}#{int(count) + 1 if count.isdigit() else 1}"


class CursorMoved(PanelRefused):
    """The panel's log cursor for the engine is one this sink did not set (another process
    of this host wrote meanwhile): following stops, and the next follower resumes from the
    panel's cursor, skipping what it covers."""

    def __init__(self, stored: str) -> None:
        super().__init__(409, f"the panel's log cursor is {stored!r}, not this follower's: "
                         "it resumes from there")


def host_kinds(events: Events) -> Events:
    """The follower's own notes (kind `status`) as the log lines the entrypoint also prints
    ("appliance: ..."): status events are the panel's alone (the ingest refuses them)."""
    return [("log", {"stream": "stdout", "text": f"appliance: {payload.get('message', '')}"})
            if kind == "status" else (kind, payload) for kind, payload in events]


def masked(events: Events, secret: str) -> Events:
    """The events with `secret` masked in every text (the engine logs its server_args)."""
    if not secret:
        return events
    return [(kind, {**payload, "text": payload["text"].replace(secret, MASK)})
            if isinstance(payload.get("text"), str) and secret in payload["text"]
            else (kind, payload) for kind, payload in events]


class RemoteSink:
    """A follower's sink over the panel's API: ship through the ingest, steps through
    the steps endpoint, for one placed engine's current start."""

    def __init__(self, placement: Mapping[str, Any], agent: SinkAgent,
                 stop: threading.Event, identity: Identity) -> None:
        self.pk = int(placement["id"])
        self.start_token = str(placement["start_token"])
        self.key = str(placement.get("engine_key") or "")
        self.progress: dict[str, Any] = dict(placement.get("progress") or {})
        # The follower's view, read by the engine's monitor (RemoteMonitorSink).
        self.status = str(placement["status"])
        self.engine_url = str(placement.get("engine_url") or "")
        self.agent, self.stop, self.identity = agent, stop, identity
        self.monitor: EngineMonitor | None = None
        self.clock = time.monotonic
        # The row's log cursor as the panel holds it: each batch names it (`after`), and the
        # panel stores the batch only while it is still the row's.
        self.stored_cursor = str(placement.get("log_cursor") or "")
        self.shipped = False  # a batch since the last quiet call

    def _call(self, send: Any) -> Any:
        """send() until the panel answers: a refusal (4xx) raised at once, another 5xx after
        SHIP_TRIES, a panel away (PANEL_AWAY_STATUSES, no connection) after PANEL_AWAY_S of
        it, or at once when this engine's work is stopped."""
        away_since: float | None = None
        failures = 0
        error: Exception
        while True:
            try:
                return send()
            except PanelRefused as exc:
                if exc.status == 401:
                    self.agent.credential_refused(exc)
                if exc.status in (401, 404, 409):
                    self.stop.set()  # not ours any more (or never again): stop writing
                    raise
                if exc.status < 500:
                    raise
                away, error = exc.status in PANEL_AWAY_STATUSES, exc
            except requests.RequestException as exc:
                away, error = True, exc
            failures += 1
            now = self.clock()
            if away:
                away_since = now if away_since is None else away_since
                if now - away_since >= PANEL_AWAY_S:
                    raise error
                if failures == 1:
                    log.warning("deployment %s: the panel is away (%s); waiting for it up to "
                                "%.0f s", self.pk, error, PANEL_AWAY_S)
            elif failures >= SHIP_TRIES:
                raise error
            if self.stop.wait(min(0.5 * 2 ** (failures - 1), 5.0)):
                raise error

    def encode(self, events: Events) -> Shipment:
        """The events as the ingest takes them; called in order, on the follower's thread,
        so the next batch is made while the shipper's write of the last one runs."""
        changed = False
        for kind, payload in events:
            if kind in ("progress", "selfcheck"):
                changed = progress_fold(self.progress, payload) or changed
        decode = next((p for k, p in reversed(events)
                       if k == "metric" and p.get("kind") == "decode_stats"), None)
        return Shipment(events, Batch.of(masked(host_kinds(events), self.key)),
                        dict(self.progress) if changed else None, decode)

    def ship(self, events: Events, cursor: Cursor | None) -> None:
        self.ship_encoded([self.encode(events)], cursor)

    def ship_encoded(self, shipments: list[Shipment], cursor: Cursor | None) -> None:
        """Ship what encode() made of the batches handed over, in order, as one."""
        progress = next((s.progress for s in reversed(shipments) if s.progress is not None),
                        None)
        decode = next((s.decode for s in reversed(shipments) if s.decode is not None), None)
        whole = shipments[0].batch if len(shipments) == 1 else Batch(
            [event for s in shipments for event in s.batch.events],
            [text for s in shipments for text in s.batch.encoded])
        parts = whole.split()
        for i, part in enumerate(parts):
            # Every batch moves the row's cursor: the one that ends at the follower's cursor
            # to it, any other (a part of a large batch, one with no line) to a marked one.
            moved = cursor.encode() if cursor is not None and i == len(parts) - 1 else ""
            if not moved or moved == self.stored_cursor:
                moved = cursor_marked(self.stored_cursor)
            row: dict[str, Any] = {"log_cursor": moved}
            if i == len(parts) - 1:
                if progress is not None:
                    row["progress"] = progress
                if decode is not None:
                    row["decode_stats"] = decode
            body = events_body(part.encoded, row=row, start_token=self.start_token,
                               after=self.stored_cursor)
            answer = self._call(lambda b=body: self.agent.link.ship_body(self.pk, b))
            if answer.get("stored") is False and answer.get("log_cursor") != moved:
                self.stop.set()
                raise CursorMoved(str(answer.get("log_cursor")))
            # Stored now, or by a try whose answer was lost (the row's cursor is this
            # batch's): either way it is the panel's.
            self.stored_cursor = moved
            self.shipped = True
        if self.monitor is not None:
            events = shipments[0].followed if len(shipments) == 1 else [
                event for s in shipments for event in s.followed]
            try:
                self.monitor.observe(events)
            except Exception:  # noqa: BLE001 - an alert must never stop the log from shipping
                log.exception("deployment %s: engine monitor: alert from the log failed",
                              self.pk)

    def _step(self, step: str, **fields: Any) -> bool:
        try:
            answer = self._call(lambda: self.agent.link.step(self.pk, step, self.start_token,
                                                             **fields))
        except PanelRefused as exc:
            log.warning("deployment %s: the panel refused the step %s: %s", self.pk, step,
                        exc.detail)
            return False
        return bool(answer and answer.get("moved"))

    def advance(self, status: str) -> bool:
        moved = self._step(status)
        if moved:
            self.status = status
        return moved

    def stopped(self) -> bool:
        """The engine of this start was stopped as the panel asked (whether the step moved)."""
        return self._step("stopped")

    def ready(self, engine_url: str) -> bool:
        self.status, self.engine_url = Status.READY, engine_url
        return self._step("ready", engine_url=engine_url)

    def failed(self, diagnosis: Diagnosis, message: str, last_lines: list[str]) -> None:
        log.warning("deployment %s: %s (%s)", self.pk, message, diagnosis.cause)
        self.agent.engine_stop(self.identity)
        found = diagnosis.to_dict()
        found["evidence"] = json.loads(json.dumps(found["evidence"], default=str))
        taken = self._step("failed", diagnosis=found, message=message[:2000],
                           last_lines=[line.replace(self.key, MASK) if self.key else line
                                       for line in last_lines[-60:]])
        if taken:
            # This start is over. A placements read from before the panel took the step
            # still says `starting`, and must not start the engine again.
            self.agent.failed_starts.add((self.pk, self.start_token))

    def keep_following(self) -> bool:
        return not self.stop.is_set()

    def idle(self) -> None:
        """A second without batches after some: the panel stores the status reads'
        answers as the last batch left the row (one call; a panel that does not take it
        loses only that: the next batch stores them)."""
        if not self.shipped:
            return
        self.shipped = False
        try:
            self.agent.link.quiet(self.pk)
        except (requests.RequestException, PanelRefused) as exc:
            log.info("deployment %s: the panel took no quiet call (%s)", self.pk, exc)


class RemoteMonitorSink:
    """The engine monitor's sink over the panel's API: each point and each step's alerts in
    one call, the series' compaction asked for once a minute.

    The report is sent from a thread of its own, waited for up to `wait_s` (less than the
    monitor's interval): a panel that does not answer at once (web stopped, its address
    answering nothing until the link's timeout; the proxy holding the call while web
    restarts) never holds the monitor past its next scrape, so the series keeps its points.
    Points and alert changes that come while a report is under way go with it or the next.

    A report the panel did not take (down, restarting, a 5xx) keeps what it carried for the
    next one: the last MONITOR_KEEP_POINTS points, so a panel away for up to PANEL_AWAY_S
    leaves no gap (the follower waits that long for it too, so this sink lives on), and every
    alert change (up to MONITOR_KEEP_ALERTS), so no raise or clear is lost. A call
    that timed out after the panel stored it is sent again: its alert events then show twice
    rather than never. A refusal (4xx: a bad field, not placed here, another start) drops
    what is kept, which would never be taken, and is the monitor's failed step, logged
    (raised by the call that waited for it, or else by the next)."""

    def __init__(self, followed: RemoteSink, wait_s: float = 5.0) -> None:
        self.followed = followed
        self.wait_s = wait_s
        self.compacted_at = time.monotonic()
        self.points: deque[dict[str, Any]] = deque(maxlen=MONITOR_KEEP_POINTS)
        self.pending_alerts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.sending: threading.Thread | None = None
        self.refusal: PanelRefused | None = None

    def status(self) -> str:
        return self.followed.status

    def engine_url(self) -> str:
        return self.followed.engine_url

    def store(self, point: MetricPoint) -> None:
        with self.lock:
            self.points.append(point.to_dict())
        self._send()

    def alerts(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            log.info("deployment %s: alert %s %s: %s", self.followed.pk, alert.id,
                     alert.state, alert.summary)
        with self.lock:
            self.pending_alerts.extend(a.to_dict() for a in alerts)
            del self.pending_alerts[:-MONITOR_KEEP_ALERTS]
        self._send()

    def _send(self) -> None:
        """A report under way takes what was added meanwhile (not waited for); else one is
        started and waited for up to wait_s. A refusal is raised here once."""
        with self.lock:
            sending = self.sending
            if sending is None or not sending.is_alive():
                sending = self.sending = threading.Thread(
                    target=self._send_all, daemon=True,
                    name=f"fleet-engine-metrics-{self.followed.pk}")
                sending.start()
            else:
                sending = None
        if sending is not None:
            sending.join(self.wait_s)
        with self.lock:
            refusal, self.refusal = self.refusal, None
        if refusal is not None:
            raise refusal

    def _send_all(self) -> None:
        """Everything kept, oldest first, in reports of MONITOR_SEND_POINTS points (the
        alert changes with the first), until the panel takes no more."""
        sink = self.followed
        while not sink.stop.is_set():
            with self.lock:
                compact = time.monotonic() - self.compacted_at > COMPACT_EVERY_S
                points = list(self.points)[:MONITOR_SEND_POINTS]
                alerts = self.pending_alerts[:]
            try:
                sink.agent.link.metrics(sink.pk, sink.start_token, points=points,
                                        alerts=alerts, compact=compact)
            except (requests.RequestException, PanelRefused) as exc:
                with self.lock:
                    if isinstance(exc, PanelRefused) and exc.status < 500:
                        self.points.clear()
                        self.pending_alerts.clear()
                        self.refusal = exc
                        return
                    kept, changes = len(self.points), len(self.pending_alerts)
                log.warning("deployment %s: the panel took no monitor report (%s); %d points "
                            "and %d alert changes go with the next", sink.pk, exc, kept,
                            changes)
                return
            with self.lock:
                # By identity: points and changes added (or the oldest let go) meanwhile.
                sent = {id(item) for item in (*points, *alerts)}
                self.points = deque((p for p in self.points if id(p) not in sent),
                                    maxlen=MONITOR_KEEP_POINTS)
                self.pending_alerts = [a for a in self.pending_alerts if id(a) not in sent]
                if compact:
                    self.compacted_at = time.monotonic()
                if not (self.points or self.pending_alerts):
                    return


def remote_monitor(placement: Mapping[str, Any], sink: RemoteSink, config: RemoteSettings,
                   settings: Mapping[str, Any]) -> EngineMonitor:
    """The engine's monitor, with the panel's interval and stall limit (`settings`, from
    its placements answer)."""
    spec = spec_from_dict(placement["spec"])
    options = monitor_options(interval_s=float(settings.get("interval_s") or 2.0),
                              stall_s=float(settings.get("stall_s") or 300),
                              disable_cuda_graph=spec.engine.disable_cuda_graph,
                              drafter=(spec.engine.speculative_draft_model_path or "")
                              if spec.engine.speculative_algorithm not in (None, "NONE")
                              else "")
    gpus = [int(g) for g in placement.get("gpus") or [] if str(g).isdigit()]
    # A report is waited for at most 3/4 of the interval: the next scrape stays on time.
    monitor_sink = RemoteMonitorSink(sink, wait_s=0.75 * options.interval_s)
    return EngineMonitor(monitor_sink, gpus=gpus if config.gpu_requests else [],
                         options=options,
                         active_alerts=list((placement.get("alerts") or {}).keys()))
