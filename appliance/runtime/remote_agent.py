"""Every host's engine agent, the panel's own included: it owns the engines the panel placed
on this host and talks to the panel over HTTP(S) only, with the host's own credential
(docs/fleet.md).

A level-triggered loop, like a Kubernetes controller, with the panel's host API for a
transport: every step is idempotent, so a restarted agent runs the loop again and adopts
what runs. Every tick it reads its placements (`GET /api/fleet/host/`:
each placed engine's id, spec, image, start token, status), starts or adopts each engine
with the follower (appliance.runtime.follower), ships its events through the ingest,
and takes its status steps through `POST .../steps/`, which the panel applies through its
lifecycle table. It holds no database or broker address; Django is never imported.

- A remote engine is published on the host's panel-facing address only
  (APPLIANCE_HOST_ADVERTISE_ADDR), so it is started with SGLang's --api-key: a key for
  that start that the panel derives and its gateway sends. The engine prints its
  server_args (the key among them) at start: the key is masked in every shipped text
  (appliance/runtime/host_sink.py: the engine's events and its last lines).
  With APPLIANCE_ENGINE_NETWORK (the panel's own host under compose) engines sit on that
  closed network instead, reached by container name, nothing published.
- The image must carry the recipe lock the panel sends (appliance.images.lock's label);
  a configured image (no recipe build) is sent without one.
- The credential refused (the host removed, or joined again elsewhere): the agent stops
  writing at once, says why, and ends; its engines keep running for an operator to see.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import requests

from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from appliance.engine.widths import needed_graph_widths
from appliance.images.build import BuildCancelled, BuildFailed
from appliance.lifecycle import AGENT_OWNED, Status
from appliance.logs.appliance_causes import IMAGE_BUILD_FAILED, MODEL_NOT_READY, start_failure
from appliance.logs.facts import spec_facts
from appliance.preflight import gpu_check_args
from appliance.runtime import gpu_telemetry
from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.client import EngineClient
from appliance.runtime.container_plan import ContainerPlan, Identity
from appliance.runtime.containers import EngineRuntime, EngineRuntimeError
from appliance.runtime.cursor import Cursor
from appliance.runtime.engine_network import join_engine_network
from appliance.runtime.follow_threads import FollowOptions
from appliance.runtime.follower import EngineFollower, follow
from appliance.runtime.host_image import HostBuildRefused, host_image, image_lock_refusal
from appliance.runtime.host_sink import RemoteSink, remote_monitor
from appliance.runtime.hostfacts import docker_facts
from appliance.runtime.mounts import engine_model_mounts
from appliance.runtime.panel_link import PanelLink, PanelRefused, panel_link_open
from appliance.runtime.secrets import secret_names_available
from appliance.runtime.strays import StraysSaid, strays_found
from appliance.runtime.work import EngineWork

log = logging.getLogger(__name__)
AGENT_VERSION = "0.9.0"


class CredentialRefused(RuntimeError):
    """The panel no longer takes this host's credential: nothing more is written."""


def host_report(runtime: EngineRuntime, config: RemoteSettings) -> dict[str, Any]:
    """The join's and the heartbeat's body: NVML's GPUs and driver version (or a GPU count),
    Docker's facts, the secret store's names (never a value)."""
    telemetry = gpu_telemetry.collect()
    report: dict[str, Any] = {
        # gpu_requests: whether engines are given GPUs at all (the simulator's hosts: no).
        "agent_version": AGENT_VERSION,
        "docker": {**docker_facts(runtime), "gpu_requests": config.gpu_requests},
        "secret_names": secret_names_available(directory=config.secrets_dir)}
    if telemetry.available:
        report["gpus"] = [{"index": g.index, "name": g.name, "uuid": g.uuid,
                           "memory_total_gb": g.memory_total_gb} for g in telemetry.gpus]
        if telemetry.driver_version:
            report["driver_version"] = telemetry.driver_version
    else:
        report["gpu_count"] = config.gpu_count
    return report


# The simulator's knob naming the engine build whose refusals it imitates
# (docker/test-engine/sglang/test_engine/refusals.py).
SIMULATED_BUILD_ENV = "TEST_ENGINE_BUILD"


def remote_plan(placement: Mapping[str, Any], config: RemoteSettings,
                instance: str) -> ContainerPlan:
    """The engine container for a placement: the one plan of every agent.

    On the engine network (`config.engine_network`) the engine is reached by container
    name and nothing is published; else its port is published on the host's advertised
    address (loopback when none). The API key is the placement's `engine_key` (none: no
    key). The placement's `simulated_build` (the panel decides it: the build the simulator
    imitates) goes in as SIMULATED_BUILD_ENV unless the environment names one already."""
    spec = spec_from_dict(placement["spec"])
    launch = launch_args(spec)
    volumes = (engine_model_mounts(argv=launch.argv, models_dir=config.models_dir)
               if config.models_dir else {})
    env = {**launch.env, **config.extra_env}
    simulated = str(placement.get("simulated_build") or "")
    if simulated and SIMULATED_BUILD_ENV not in env:
        env[SIMULATED_BUILD_ENV] = simulated
    if spec.self_check and config.gpu_check:
        # The image's entrypoint runs appliance.selfcheck with these before the engine.
        env["APPLIANCE_GPU_CHECK"] = "1"
        env["APPLIANCE_GPU_CHECK_ARGS"] = json.dumps(gpu_check_args(spec))
    return ContainerPlan(
        deployment_id=str(placement["id"]), image=str(placement["image"]), argv=launch.argv,
        env=env, gpus=list(placement.get("gpus") or []) if config.gpu_requests else [],
        container_port=spec.engine.port, network=config.engine_network or None,
        publish_host=config.advertise_addr or "127.0.0.1",
        volumes=volumes, instance_id=instance, start_token=str(placement["start_token"]),
        shm_size=spec.shm_size or config.shm_size, pids_limit=config.pids_limit or None,
        mem_limit=config.memory_limit or None,
        # Only this deployment's declared names; their values are read at container start.
        secrets=list(launch.secrets),
        secrets_dir=config.secrets_dir, api_key=str(placement.get("engine_key") or ""))


# Heartbeats per lost threshold at least: a beat every threshold exactly (the panel's 10 s
# against the trial's APPLIANCE_AGENT_SILENT_S of 10) let every tick's own second read as a
# host gone, for a moment each cycle, in the gateway's rotation and on every page.
BEATS_PER_THRESHOLD = 3


def heartbeat_interval(answer: Mapping[str, Any], current: float) -> float:
    """How often to beat: the panel's `heartbeat_s`, and at most a BEATS_PER_THRESHOLD-th of
    its `lost_after_s`, so a late tick (a slow Docker call, a slow answer) never makes a
    live host read lost."""
    told = float(answer.get("heartbeat_s") or current)
    lost_after = float(answer.get("lost_after_s") or 0)
    return min(told, lost_after / BEATS_PER_THRESHOLD) if lost_after > 0 else told


@dataclass
class RemoteAgent:
    """Call tick() every second or two (run() does), from one thread."""

    link: PanelLink
    config: RemoteSettings
    runtime: EngineRuntime = field(default_factory=EngineRuntime)
    work: dict[int, EngineWork] = field(default_factory=dict)
    refused: PanelRefused | None = None
    heartbeat_s: float = 10.0
    monitor_settings: dict[str, Any] = field(default_factory=dict)  # the panel's, each tick
    # (deployment, start token) of the starts whose failure the panel has taken: never
    # followed again (a restart comes with a new token).
    failed_starts: set[tuple[int, str]] = field(default_factory=set)
    _beat_at: float = 0.0
    _held: bool = False  # another agent process holds this host (said once)
    # The install's id and the (deployment, start token) of each engine placed here, as the
    # last placements read gave them; None while another agent process holds the host.
    _placed: tuple[str, frozenset[tuple[str, str]]] | None = None
    _strays_said: StraysSaid = field(default_factory=StraysSaid)

    def run(self, stop: threading.Event) -> None:
        log.info("fleet agent for host %s running against %s", self.config.host_name,
                 self.config.panel_url)
        while not stop.is_set() and self.refused is None:
            try:
                self.tick()
            except CredentialRefused:
                break
            except (requests.RequestException, PanelRefused) as exc:
                log.warning("the panel did not answer (%s); trying again", exc)
            except Exception:  # noqa: BLE001 - Docker is back next tick
                log.exception("fleet agent tick failed; retrying")
            stop.wait(self.config.tick_s)
        self.stop_following()

    def credential_refused(self, exc: PanelRefused) -> None:
        if self.refused is None:
            log.error("the panel refused this host's credential (%s): the agent stops "
                      "writing and ends. Engines keep running. Join again with a new join "
                      "token (APPLIANCE_JOIN_TOKEN, or a file named by "
                      "APPLIANCE_JOIN_TOKEN_FILE) if the host was removed.", exc.detail)
        self.refused = exc
        for work in self.work.values():
            work.stop.set()

    def _panel(self, call: Any) -> Any:
        try:
            return call()
        except PanelRefused as exc:
            if exc.status == 401:
                self.credential_refused(exc)
                raise CredentialRefused(exc.detail) from None
            raise

    def tick(self) -> None:
        try:
            answer = self._panel(self.link.me)
        except PanelRefused as exc:
            if exc.status != 409:
                raise
            self._held_elsewhere(exc)
            self._placed = None  # its agent reports the strays
            self._beat()  # alive, and so are the host's engines: only their writes wait
            return
        self._held = False
        placements = {int(p["id"]): p for p in answer.get("placements", [])
                      if p.get("status") in AGENT_OWNED and p.get("start_token")}
        self.heartbeat_s = heartbeat_interval(answer, self.heartbeat_s)
        self.monitor_settings = dict(answer.get("monitor") or {})
        self._placed = (str(answer.get("instance_id", "")),
                        frozenset((str(pk), str(p["start_token"])) for pk, p in placements.items()))
        for placement in placements.values():
            self._step(placement, str(answer.get("instance_id", "")))
        for pk in [pk for pk in self.work if pk not in placements]:
            self.work.pop(pk).stop.set()
        self.failed_starts &= {(pk, str(p["start_token"])) for pk, p in placements.items()}
        self._beat()

    def _beat(self) -> None:
        if time.monotonic() - self._beat_at < self.heartbeat_s:
            return
        report = host_report(self.runtime, self.config)
        if self._placed is not None:  # the strays: no engine placed here owns them
            instance, owned = self._placed
            report["foreign_containers"] = strays_found(self.runtime, instance=instance,
                                                        owned=owned)
        self._panel(lambda: self.link.heartbeat(report))
        self._beat_at = time.monotonic()
        if "foreign_containers" in report:  # said once the panel has them (the Hosts page)
            self._strays_said.say(report["foreign_containers"])

    def _held_elsewhere(self, exc: PanelRefused) -> None:
        """Another agent process of this host holds it: write nothing until it is ours."""
        if not self._held:
            log.warning("%s", exc.detail)
        self._held = True
        for pk in list(self.work):
            self.work.pop(pk).stop.set()

    def stop_following(self) -> None:
        for work in self.work.values():
            work.stop.set()
        for work in self.work.values():
            work.thread.join(timeout=5)
        if self.refused is None:
            try:  # the next agent process of this host takes over at once
                self.link.release()
            except (requests.RequestException, PanelRefused) as exc:
                log.info("the panel took no release of this host (%s)", exc)
        self.link.close()

    def _step(self, placement: dict[str, Any], instance: str) -> None:
        pk = int(placement["id"])
        kind = "stop" if placement["status"] == Status.STOPPING else "follow"
        current = self.work.get(pk)
        if current is not None and current.thread.is_alive():
            if current.kind == kind and current.token == placement["start_token"]:
                return
            current.stop.set()
            if current.kind == "follow" and kind == "stop":
                current.thread.join(timeout=2)
            else:
                return
        if kind == "follow" and (_waiting_to_restart(placement)
                                 or (pk, str(placement["start_token"])) in self.failed_starts):
            return
        stop = threading.Event()
        target = self._stop_engine if kind == "stop" else self._follow
        thread = threading.Thread(target=self._guarded, args=(target, placement, instance, stop),
                                  name=f"fleet-engine-{kind}-{pk}", daemon=True)
        self.work[pk] = EngineWork(thread, stop, str(placement["start_token"]), kind)
        thread.start()

    def _guarded(self, target: Any, placement: dict[str, Any], instance: str,
                 stop: threading.Event) -> None:
        try:
            target(placement, instance, stop)
        except PanelRefused as exc:
            log.info("deployment %s: the panel refused a write (%s); following stops",
                     placement["id"], exc.detail)
        except Exception:  # noqa: BLE001 - the next tick starts a new follower
            log.exception("deployment %s: fleet engine thread failed", placement["id"])

    def _follow(self, placement: dict[str, Any], instance: str, stop: threading.Event) -> None:
        identity = Identity(str(placement["id"]), instance, str(placement["start_token"]))
        sink = RemoteSink(placement, self, stop, identity)
        starting = placement["status"] == Status.STARTING
        if starting and not placement.get("image"):  # the panel left the build to this host
            image = self._build(placement, sink, stop)
            if not image:
                return
            placement = {**placement, "image": image}
        if starting and not self._may_start(placement, sink):
            return
        spec = spec_from_dict(placement["spec"])
        key = sink.key
        follower = EngineFollower(
            self.runtime, remote_plan(placement, self.config, instance), sink,
            status=str(placement["status"]), cursor=Cursor.decode(placement.get("log_cursor")
                                                                  or ""),
            may_start=starting,
            options=FollowOptions(ready_timeout_s=float(self.config.ready_timeout_s)),
            client_factory=lambda url: EngineClient(url, timeout=5.0, api_key=key),
            needed_widths=needed_graph_widths(spec.engine), facts=spec_facts(spec))
        monitor = sink.monitor = remote_monitor(placement, sink, self.config,
                                                self.monitor_settings)
        watching = threading.Thread(target=monitor.run, args=(stop,), daemon=True,
                                    name=f"fleet-engine-monitor-{sink.pk}")
        watching.start()
        try:
            follow(follower)
        except EngineRuntimeError as exc:
            if not stop.is_set():
                sink.failed(start_failure(str(exc)), str(exc), [])
        finally:
            stop.set()  # the follower ended: so does its monitor
            watching.join(timeout=5)

    def _build(self, placement: Mapping[str, Any], sink: RemoteSink,
               stop: threading.Event) -> str:
        """The image built here ('' when it could not be: the deployment failed, saying
        why, or a stop ended the build)."""
        ship = lambda events: sink.ship(events, None)  # noqa: E731 - a sink's call, named
        try:
            return host_image(placement, self.config, self.runtime, ship, stop)
        except BuildCancelled:
            return ""  # stopped: the next tick stops what is left
        except HostBuildRefused as exc:
            sink.failed(start_failure(str(exc)), str(exc), [])
        except BuildFailed as exc:
            sink.failed(IMAGE_BUILD_FAILED.worded(summary=str(exc), evidence=exc.to_dict()),
                        str(exc), list(exc.last_output_lines))
        return ""

    def _may_start(self, placement: Mapping[str, Any], sink: RemoteSink) -> bool:
        refused = list(placement.get("models_refused") or [])
        if refused:
            message = f"not verified in the model store: {', '.join(refused)}"
            sink.failed(MODEL_NOT_READY.worded(summary=f"The engine was not started: {message}.",
                                               evidence={"models": refused}), message, [])
            return False
        lock = image_lock_refusal(self.runtime, str(placement["image"]),
                                  placement.get("lock_digest"))
        if lock:
            sink.failed(start_failure(lock), lock, [])
            return False
        if not (self.config.gpu_requests and placement.get("gpus")):
            return True
        if docker_facts(self.runtime).get("nvidia", True):
            return True
        message = "this host's Docker has no NVIDIA runtime"
        sink.failed(start_failure(message), message, [])
        return False

    def _stop_engine(self, placement: dict[str, Any], instance: str,
                     stop: threading.Event) -> None:
        identity = Identity(str(placement["id"]), instance, str(placement["start_token"]))
        self.engine_stop(identity)
        RemoteSink(placement, self, stop, identity).stopped()

    def engine_stop(self, identity: Identity) -> None:
        """Stop an engine container of this host (its sink's after a failure too): the one
        place an engine container is stopped."""
        self.runtime.stop(identity, timeout_s=self.config.stop_timeout_s)


def _waiting_to_restart(placement: Mapping[str, Any]) -> bool:
    not_before = placement.get("restart_not_before")
    return (placement.get("status") == Status.STARTING and bool(not_before)
            and datetime.now(UTC) < datetime.fromisoformat(str(not_before)))


def remote_agent_run_forever(stop: threading.Event, environ: Mapping[str, str] | None = None
                             ) -> int:
    """The fleet host's agent (worker/agent.py with APPLIANCE_PANEL_URL): join or reuse the
    stored credential, then run until stopped; 3 when the panel refused this host."""
    config = RemoteSettings.from_env(environ)
    runtime = EngineRuntime()
    note = join_engine_network(runtime, config.engine_network)
    if note:
        log.warning("%s", note)
    link = panel_link_open(panel_url=config.panel_url, credential_path=config.credential_path,
                           token=config.join_token, name=config.host_name,
                           report=host_report(runtime, config))
    agent = RemoteAgent(link=link, config=config, runtime=runtime)
    agent.run(stop)
    return 3 if agent.refused is not None else 0
