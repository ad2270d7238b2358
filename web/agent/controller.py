"""The engine agent: one long-running process per GPU host owns its engine containers.

Level-triggered, like a Kubernetes controller: every tick it compares each deployment
that should have an engine (the database) with what Docker reports, and takes the next
step. Every step is idempotent, so a restarted agent simply runs the loop again.

- Ownership is a lease on the deployment row (agent id, expiry), renewed every tick;
  another agent takes over only an expired lease. The agent id is stable per host, so
  a restarted agent takes its own engines back at once.
- One follower thread per engine (appliance.runtime.follower) starts or adopts the
  container and follows it from the stored cursor for its whole life; its batches and
  the cursor are written in one statement, guarded by the lease, so no line is
  stored twice or lost when an agent dies.
- Beside each follower a monitor thread (monitoring.py) scrapes the engine's
  /metrics into the deployment's series once ready, and raises alerts (stalls, acceptance
  collapse, silent eager decoding, KV pressure, an unreachable /metrics).
- Stopping an engine is this agent's alone (stop, remove, mark stopped): it owns the
  containers, and a stop never waits behind a Celery job.
- Its tick is its own host's work only (claim, step, heartbeat and report); the duties
  that span the panel (rolling changes, dead builds' re-queue, the Tune sweep, retention)
  are the panel loop's (web/loop.py).
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection as db_connection
from django.db.models import Q
from django.utils import timezone

from appliance.engine.spec import spec_from_dict
from appliance.engine.widths import needed_graph_widths
from appliance.events import DECODE_STATS
from appliance.lifecycle import AGENT_OWNED
from appliance.logs.appliance_causes import MODEL_NOT_READY, start_failure
from appliance.logs.causes import Diagnosis
from appliance.logs.facts import spec_facts
from appliance.runtime import gpu_telemetry
from appliance.runtime.containers import EngineRuntime, EngineRuntimeError
from appliance.runtime.engine_network import join_engine_network
from appliance.runtime.follower import Cursor, EngineFollower, Events, FollowOptions, follow
from appliance.runtime.hostfacts import docker_facts
from appliance.runtime.progress import progress_fold
from appliance.runtime.secrets import secret_names_available
from appliance.runtime.work import EngineWork
from web.deployments.models import Deployment, DeploymentStatus, EventKind
from web.deployments.services.events import (
    events_append_batch,
    events_batches_quiet,
)
from web.deployments.services.installation import instance_id
from web.deployments.services.lifecycle import (
    ADVANCE,
    deployment_mark_failed,
    deployment_mark_ready,
    deployment_mark_stopped,
    deployment_restart_after_death,
)
from web.deployments.services.reads import deployment_status_bodies_later
from web.fleet.services import host_heartbeat_local, host_report_local
from web.store.loadtime import deployment_models_refused

from .engines import container_plan, identity_of
from .monitoring import MonitorHandle, monitor_start

log = logging.getLogger(__name__)
S = DeploymentStatus
KEPT_LEASE_SHARE = 2 / 3  # a lease with more left than this share of it is not renewed


# With Django's connection pool, close() hands the connection back instead of ending it.
_OPTIONS: Any = settings.DATABASES["default"].get("OPTIONS") or {}
_POOLED = "pool" in _OPTIONS


# What join_engine_network found wrong with the engine network, for the host's report.
_network_notes: dict[str, str] = {}


def default_agent_id() -> str:
    return settings.AGENT_ID or f"agent@{socket.gethostname()}"


class _Released(Exception):
    """The lease is gone (another agent owns the engine now): stop writing."""


class _FollowSink:
    """Adapts a follower to one deployment's row and event log, under the agent's lease."""

    def __init__(self, deployment: Deployment, agent: EngineAgent, stop: threading.Event) -> None:
        self.pk = deployment.pk
        self.identity = identity_of(deployment)
        self.start_token = deployment.start_token
        self.agent = agent
        self.stop = stop
        self.progress: dict[str, Any] = dict(deployment.progress or {})
        # The follower's view, read by the engine's monitor (monitoring.py).
        self.status = str(deployment.status)
        self.engine_url = deployment.engine_url
        self.monitor: MonitorHandle | None = None

    def ship(self, events: Events, cursor: Cursor | None) -> None:
        decode = next((p for k, p in reversed(events)
                       if k == EventKind.METRIC and p.get("kind") == DECODE_STATS), None)
        changed = False
        for kind, payload in events:
            if kind in (EventKind.PROGRESS, EventKind.SELFCHECK):
                changed = progress_fold(self.progress, payload) or changed
        row: dict[str, Any] = {}
        if cursor is not None:
            row["log_cursor"] = cursor.encode()
        if changed:
            row["progress"] = self.progress
        if decode is not None:
            row["decode_stats"] = decode
        try:
            # One statement: stored only under this agent's lease, with the cursor (a
            # takeover's claim or a delete holding the row first leaves nothing stored).
            events_append_batch(deployment_id=self.pk, events=events,
                                owner=self.agent.agent_id, row=row)
        except Deployment.DoesNotExist:
            self.stop.set()
            raise _Released() from None
        if self.monitor is not None:
            self.monitor.observe(events)

    def idle(self) -> None:
        # The status reads' answers, if the last batches left them stale (events.py).
        events_batches_quiet(deployment_id=self.pk)
        # The shipper keeps its connection while batches keep coming (each checkout is a
        # pool check, a round trip) and gives it back after a second with none.
        if _POOLED:
            db_connection.close()  # back to the pool: one follower per engine, many engines

    def advance(self, status: str) -> bool:
        step = ADVANCE.get(status)
        moved = step(deployment_id=self.pk) if step else False
        if moved:
            self.status = status
        return moved

    def ready(self, engine_url: str) -> bool:
        # The follower goes on as ready whatever the UPDATE says; so does its monitor.
        self.engine_url, self.status = engine_url, "ready"
        return deployment_mark_ready(deployment_id=self.pk, engine_url=engine_url)

    def failed(self, diagnosis: Diagnosis, message: str, last_lines: list[str]) -> None:
        log.warning("deployment %s: %s (%s)", self.pk, message, diagnosis.cause)
        # The container goes first, so a deployment seen failed has no engine left.
        self.agent.remove_engine(self.identity)
        # Died while serving: the spec's restart policy may start it again (lifecycle.py).
        if self.status == S.READY and deployment_restart_after_death(
                deployment_id=self.pk, start_token=self.start_token,
                diagnosis=diagnosis, message=message):
            return
        deployment_mark_failed(
            deployment_id=self.pk, diagnosis=diagnosis, last_lines=last_lines,
            message=message)

    def keep_following(self) -> bool:
        return not self.stop.is_set()


@dataclass
class EngineAgent:
    """Call tick() every second or two (run() does), from one thread."""

    agent_id: str = field(default_factory=default_agent_id)
    runtime: EngineRuntime = field(default_factory=EngineRuntime)
    lease_s: float = 15.0
    follow_options: FollowOptions = field(default_factory=FollowOptions)
    work: dict[int, EngineWork] = field(default_factory=dict)
    paused: threading.Event = field(default_factory=threading.Event)  # tests hold it still
    _ticks: int = 0
    _strays_said: frozenset[str] = frozenset()

    def run(self, stop: threading.Event, tick_s: float = 1.0) -> None:
        log.info("engine agent %s running (instance %s)", self.agent_id, instance_id())
        try:
            while not stop.is_set():
                try:
                    if not self.paused.is_set():
                        self.tick()
                except Exception:  # noqa: BLE001 - the database or Docker is back next tick
                    log.exception("engine agent tick failed; retrying")
                    db_connection.close()
                stop.wait(tick_s)
            self.release_all()
        finally:
            db_connection.close()

    def tick(self) -> None:
        now = timezone.now()
        owned = self._claim(now)
        for deployment in owned:
            self._step(deployment)
        for pk in [pk for pk in self.work if pk not in {d.pk for d in owned}]:
            self.work.pop(pk).stop.set()  # no longer ours, or no longer running
        if self._ticks % 10 == 0:
            self._report_host(now)
        else:  # the heartbeat alone, every tick: a silent agent is seen in seconds (silence.py)
            host_heartbeat_local(name=self.agent_id.split("@", 1)[-1])
        self._ticks += 1

    def release_all(self) -> None:
        for work in self.work.values():
            work.stop.set()
        for work in self.work.values():
            work.thread.join(timeout=5)
        Deployment.objects.filter(agent_id=self.agent_id).update(lease_until=timezone.now())

    # ------------------------------------------------------------------ leases

    def _claim(self, now: Any) -> list[Deployment]:
        until = now + timedelta(seconds=self.lease_s)
        free = Q(agent_id=self.agent_id) | Q(lease_until__isnull=True) | Q(lease_until__lt=now)
        # A lease of this agent's with more than two thirds of it left is kept as it is:
        # each renewal writes the row, which changes its version, and so the status reads'
        # ETag and their stored answers (web/deployments/services/reads.py), which a
        # renewal every tick made stale every second, every read then rendered again. An
        # agent that dies leaves at least two thirds of its lease to run before another
        # takes its engines over.
        kept = Q(agent_id=self.agent_id, lease_until__gte=now + timedelta(
            seconds=self.lease_s * KEPT_LEASE_SHARE))
        # This agent's: the rows placed on the panel's own host, and any row with no
        # placement (made before placements, or by hand); a row placed on another host is
        # that host's remote agent's (docs/fleet.md).
        candidates = Deployment.objects.filter(status__in=AGENT_OWNED).filter(
            Q(placements__isnull=True) | Q(placements__host__name=settings.HOST_NAME)).distinct()
        owned = list(candidates.filter(kept).values_list("pk", flat=True))
        for pk in candidates.filter(free).exclude(pk__in=owned).values_list("pk", flat=True):
            if Deployment.objects.filter(pk=pk, status__in=AGENT_OWNED).filter(free).update(
                    agent_id=self.agent_id, lease_until=until):
                owned.append(pk)
                # The reads' answers at the row's new version.
                deployment_status_bodies_later(deployment_id=pk)
        return list(Deployment.objects.filter(pk__in=owned))

    # ------------------------------------------------------------------ steps

    def _step(self, deployment: Deployment) -> None:
        current = self.work.get(deployment.pk)
        kind = "stop" if deployment.status == S.STOPPING else "follow"
        if current is not None and current.thread.is_alive():
            if current.kind == kind and current.token == deployment.start_token:
                return
            current.stop.set()  # a stop request (or a new start) ends the follower
            if current.kind == "follow" and kind == "stop":
                current.thread.join(timeout=2)
            else:
                return
        if kind == "follow" and _waiting_to_restart(deployment):
            return
        target = self._stop_engine if kind == "stop" else self._follow
        stop = threading.Event()
        thread = threading.Thread(target=self._guarded, args=(target, deployment, stop),
                                  name=f"engine-{kind}-{deployment.pk}", daemon=True)
        self.work[deployment.pk] = EngineWork(thread, stop, deployment.start_token, kind)
        thread.start()

    def _guarded(self, target: Any, deployment: Deployment, stop: threading.Event) -> None:
        try:
            target(deployment, stop)
        except _Released:
            log.info("deployment %s: lease lost; another agent follows it", deployment.pk)
        except Exception:  # noqa: BLE001 - the next tick starts a new follower
            log.exception("deployment %s: %s thread failed", deployment.pk, target.__name__)
        finally:
            db_connection.close()

    def _follow(self, deployment: Deployment, stop: threading.Event) -> None:
        sink = _FollowSink(deployment, self, stop)
        if deployment.status == S.STARTING and not self._may_start(deployment, sink):
            return
        follower = EngineFollower(
            self.runtime, container_plan(deployment, deployment.image), sink,
            status=deployment.status, cursor=Cursor.decode(deployment.log_cursor),
            may_start=deployment.status == S.STARTING,
            options=self.follow_options,
            needed_widths=needed_graph_widths(spec_from_dict(deployment.spec).engine),
            facts=spec_facts(spec_from_dict(deployment.spec)))
        monitor = sink.monitor = monitor_start(deployment=deployment, followed=sink,
                                               agent_id=self.agent_id, pooled=_POOLED)
        try:
            follow(follower)
        except EngineRuntimeError as exc:
            if not stop.is_set():
                sink.failed(start_failure(str(exc)), str(exc), [])
        finally:
            monitor.stop()

    def _may_start(self, deployment: Deployment, sink: _FollowSink) -> bool:
        """GPU access is detected, not assumed: no NVIDIA runtime, no GPU deployment.
        A model the store has not verified is never mounted: the start fails instead."""
        refused = deployment_models_refused(deployment=deployment)
        if refused:
            message = f"not verified in the model store: {', '.join(refused)}"
            sink.failed(MODEL_NOT_READY.worded(summary=f"The engine was not started: {message}.",
                                               evidence={"models": refused}), message, [])
            return False
        if not (settings.ENGINE_GPU_REQUESTS and deployment.gpus):
            return True
        facts = docker_facts(self.runtime)
        if facts.get("nvidia", True):
            return True
        message = "this host's Docker has no NVIDIA runtime"
        sink.failed(start_failure(message), message, [])
        return False

    def _stop_engine(self, deployment: Deployment, stop: threading.Event) -> None:
        self.remove_engine(identity_of(deployment))
        deployment_mark_stopped(deployment_id=deployment.pk)

    def remove_engine(self, identity: Any) -> None:
        self.runtime.stop(identity, timeout_s=settings.ENGINE_STOP_TIMEOUT_S)

    # ------------------------------------------------------------------ host

    def _say_strays(self, strays: list[dict[str, Any]]) -> None:
        """A warning in the agent's log when new strays appear (the Hosts page lists them)."""
        names = frozenset(str(c["name"]) for c in strays)
        if names - self._strays_said:
            log.warning(_strays_warning(sorted(names)))
        self._strays_said = names

    def _report_host(self, now: Any) -> None:
        known = {(str(d.pk), d.start_token) for d in
                 Deployment.objects.filter(status__in=AGENT_OWNED)}
        mine = instance_id()
        strays = []
        for container in self.runtime.list_managed():
            labels = container.labels or {}
            key = (labels.get("appliance.deployment", ""), labels.get("appliance.start-token", ""))
            if labels.get("appliance.instance") != mine or key not in known:
                strays.append({"name": container.name, "status": container.status,
                               "labels": {k: v for k, v in labels.items()
                                          if k.startswith("appliance.")}})
        # Named after the agent (agent@<host>), not the container: a recreated agent
        # container is the same host, not a new row.
        host = self.agent_id.split("@", 1)[-1]
        report: dict[str, Any] = {
            "docker": {**docker_facts(self.runtime),
                       "engine_network_open": _network_notes.get("open", ""),
                       # Whether engines are given GPUs at all (the simulator: no).
                       "gpu_requests": settings.ENGINE_GPU_REQUESTS},
            "foreign_containers": strays,
            "gpu_telemetry": gpu_telemetry.collect().to_dict(),
            # Names only: pre-flight refuses a spec whose secret this store lacks.
            "secret_names": secret_names_available(directory=settings.ENGINE_SECRETS_DIR)}
        host_report_local(name=host, agent_id=self.agent_id, **report)
        # Said once the row is stored: the warning points the reader at the Hosts page,
        # which lists them from that row.
        self._say_strays(strays)


def _strays_warning(names: list[str]) -> str:
    return (f"containers with the appliance's labels that no deployment of this install owns: "
            f"{', '.join(names)} (an engine left running by `docker compose down -v`, which "
            "deletes the database, is one; a running one keeps its GPUs). They are never "
            f"adopted or stopped; if they are yours, remove them: docker rm -f {' '.join(names)}")


def _waiting_to_restart(deployment: Deployment) -> bool:
    """The restart policy's wait before the engine's next start has not run out yet."""
    not_before = deployment.restart_not_before
    return (deployment.status == S.STARTING and not_before is not None
            and timezone.now() < not_before)


def agent_run_forever(stop: threading.Event | None = None) -> None:
    """The engine agent's entry point (worker/agent.py)."""
    note = join_engine_network(EngineRuntime(), settings.ENGINE_NETWORK)
    if note:  # an older version's network, engines on it: said on Hosts
        _network_notes["open"] = note
    EngineAgent(follow_options=FollowOptions(
        ready_timeout_s=float(settings.ENGINE_READY_TIMEOUT_S))).run(
        stop or threading.Event(), tick_s=settings.AGENT_TICK_S)
