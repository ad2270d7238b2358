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
  server_args (the key among them) at start: the key is masked in every shipped text.
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
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from appliance.engine.launch import launch_args
from appliance.engine.recipes import RecipeError, load_site_recipe
from appliance.engine.spec import spec_from_dict
from appliance.engine.widths import needed_graph_widths
from appliance.images.build import BuildCancelled, BuildEvent, BuildFailed, build_image, image_id
from appliance.images.lock import LOCK_LABEL, lock_digest
from appliance.images.plan import BuildError, plan_build, recipe_lock_path
from appliance.lifecycle import AGENT_OWNED, Status
from appliance.logs.appliance_causes import IMAGE_BUILD_FAILED, MODEL_NOT_READY, start_failure
from appliance.logs.causes import Diagnosis
from appliance.logs.facts import spec_facts
from appliance.preflight import gpu_check_args
from appliance.runtime import gpu_telemetry
from appliance.runtime.alerts import Alert
from appliance.runtime.client import EngineClient
from appliance.runtime.containers import (
    ContainerPlan,
    EngineRuntime,
    EngineRuntimeError,
    Identity,
)
from appliance.runtime.engine_network import join_engine_network
from appliance.runtime.follower import Cursor, EngineFollower, Events, FollowOptions, follow
from appliance.runtime.hostfacts import docker_facts
from appliance.runtime.monitor import EngineMonitor, monitor_options
from appliance.runtime.mounts import engine_model_mounts
from appliance.runtime.panel_link import (
    PanelLink,
    PanelRefused,
    event_json,
    events_body,
    panel_link_open,
)
from appliance.runtime.progress import progress_fold
from appliance.runtime.secrets import secret_names_available
from appliance.runtime.series import MetricPoint
from appliance.runtime.strays import StraysSaid, strays_found
from appliance.runtime.work import EngineWork

log = logging.getLogger(__name__)
AGENT_VERSION = "0.9.0"
MAX_BATCH_BYTES = 512 * 1024  # the panel's body limit is 1 MiB (APPLIANCE_MAX_BODY_BYTES)
SHIP_TRIES = 5  # a batch the panel refused with another 5xx is sent again, then the follower
# starts over. A panel that is away (no connection, a timeout, the proxy's 502/503/504 while
# web restarts) is waited for instead, up to PANEL_AWAY_S: the follower, and with it the
# engine's monitor and the points it keeps, outlives a panel restart or upgrade.
PANEL_AWAY_S = 600.0
PANEL_AWAY_STATUSES = frozenset({502, 503, 504})
MASK = "***"
CREDENTIAL_PATH = "/var/lib/appliance/host-credential/credential"  # a volume (compose.host.yaml)
# Kept while the panel does not answer: PANEL_AWAY_S of points at the default 2 s interval,
# sent in reports of MONITOR_SEND_POINTS (the most one report may carry: web/fleet/services.py's
# MAX_POINTS), and the latest alert changes (MAX_ALERTS).
MONITOR_KEEP_POINTS = 300
MONITOR_SEND_POINTS = 30
MONITOR_KEEP_ALERTS = 20
COMPACT_EVERY_S = 60.0  # the panel merges the series' old points this often (monitoring.py's)


class CredentialRefused(RuntimeError):
    """The panel no longer takes this host's credential: nothing more is written."""


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name} is a whole number, not {raw!r}") from None


def _env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in {"1", "0", "true", "false", "yes", "no"}:
        raise SystemExit(f"{name} is true or false, not {raw!r}")
    return raw in {"1", "true", "yes"}


@dataclass(frozen=True)
class RemoteSettings:
    """The remote agent's configuration: environment variables, the panel's names.

    With `engine_network` (a compose install's own host) engines sit on that Docker network,
    reached by container name, and nothing is published: `advertise_addr` is then unused."""

    panel_url: str
    host_name: str
    advertise_addr: str
    join_token: str = field(default="", repr=False)
    credential_path: Path = Path(CREDENTIAL_PATH)
    engine_network: str = ""
    models_dir: str = ""
    secrets_dir: str = "/run/secrets/engine"
    gpu_requests: bool = True
    gpu_check: bool = True
    gpu_count: int = 0  # the GPUs to report where NVML is missing
    shm_size: str = "32g"
    pids_limit: int = 8192
    memory_limit: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    stop_timeout_s: int = 30
    ready_timeout_s: int = 3600
    tick_s: float = 1.0
    recipes_dir: str = ""  # the site's recipes, as the panel's APPLIANCE_RECIPES_DIR
    build_ca_bundle: str = ""  # a proxy's CA for the image builds' download steps

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RemoteSettings:
        env = os.environ if environ is None else environ
        network = env.get("APPLIANCE_ENGINE_NETWORK", "")
        needed = ["APPLIANCE_PANEL_URL", "APPLIANCE_HOST_NAME"]
        if not network:  # published engines: the panel needs their address
            needed.append("APPLIANCE_HOST_ADVERTISE_ADDR")
        missing = [n for n in needed if not env.get(n)]
        if missing:
            raise SystemExit(f"set {', '.join(missing)}: a fleet host's agent needs the "
                             "panel's address, its own name and the address the panel "
                             "reaches its engines at, unless they sit on an engine network "
                             "(APPLIANCE_ENGINE_NETWORK) (docs/fleet.md)")
        extra = [item.split("=", 1) for item in env.get("APPLIANCE_ENGINE_EXTRA_ENV", "")
                 .split(",") if "=" in item]
        credential_path = Path(env.get("APPLIANCE_HOST_CREDENTIAL_FILE", CREDENTIAL_PATH))
        token = env.get("APPLIANCE_JOIN_TOKEN", "")
        token_file = env.get("APPLIANCE_JOIN_TOKEN_FILE", "")
        if not token and token_file:
            # With a stored credential the token is only a fallback: read, never waited for.
            stored = credential_path.is_file() and credential_path.stat().st_size > 0
            wait_s = 0 if stored else _env_int(env, "APPLIANCE_JOIN_TOKEN_WAIT_S",
                                                  JOIN_TOKEN_WAIT_S)
            token = join_token_read(Path(token_file), wait_s=wait_s)
            if not token and not stored:
                raise SystemExit(f"no join token in {token_file} after {wait_s} s and no "
                                 f"stored credential in {credential_path}: the panel writes "
                                 "one there (manage.py ownhost, or jointokens --out)")
        return cls(
            panel_url=env["APPLIANCE_PANEL_URL"], host_name=env["APPLIANCE_HOST_NAME"],
            advertise_addr=env.get("APPLIANCE_HOST_ADVERTISE_ADDR", ""),
            join_token=token, credential_path=credential_path, engine_network=network,
            models_dir=env.get("APPLIANCE_MODELS_DIR", ""),
            secrets_dir=env.get("APPLIANCE_ENGINE_SECRETS_DIR", "/run/secrets/engine"),
            gpu_requests=_env_bool(env, "APPLIANCE_ENGINE_GPU_REQUESTS", True),
            gpu_check=_env_bool(env, "APPLIANCE_ENGINE_GPU_CHECK", True),
            gpu_count=_env_int(env, "APPLIANCE_GPU_COUNT", 0),
            shm_size=env.get("APPLIANCE_ENGINE_SHM_SIZE", "32g"),
            pids_limit=_env_int(env, "APPLIANCE_ENGINE_PIDS_LIMIT", 8192),
            memory_limit=env.get("APPLIANCE_ENGINE_MEMORY_LIMIT", ""),
            extra_env={k.strip(): v for k, v in extra},
            stop_timeout_s=_env_int(env, "APPLIANCE_ENGINE_STOP_TIMEOUT_S", 30),
            ready_timeout_s=_env_int(env, "APPLIANCE_ENGINE_READY_TIMEOUT_S", 3600),
            tick_s=float(_env_int(env, "APPLIANCE_AGENT_TICK_MS", 1000)) / 1000,
            recipes_dir=env.get("APPLIANCE_RECIPES_DIR", ""),
            build_ca_bundle=env.get("APPLIANCE_BUILD_CA_BUNDLE", ""))


JOIN_TOKEN_WAIT_S = 120  # how long the agent waits for its join token file by default
JOIN_TOKEN_POLL_S = 0.2


def join_token_read(path: Path, *, wait_s: float) -> str:
    """The join token in `path` once it is there and not empty, looked for up to `wait_s`
    (the panel's side writes it whole, then renames it in place); '' when none came. The
    token itself is never logged or put in the environment."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            token = ""
        except OSError as exc:
            raise SystemExit(f"cannot read the join token file {path}: {exc.strerror}") from None
        if token or time.monotonic() >= deadline:
            return token
        time.sleep(min(JOIN_TOKEN_POLL_S, max(deadline - time.monotonic(), 0.0)))


def host_report(runtime: EngineRuntime, config: RemoteSettings) -> dict[str, Any]:
    """The join's and the heartbeat's body: NVML's GPUs (or a count), Docker's facts, the
    secret store's names (never a value)."""
    telemetry = gpu_telemetry.collect()
    report: dict[str, Any] = {
        # gpu_requests: whether engines are given GPUs at all (the simulator's hosts: no).
        "agent_version": AGENT_VERSION,
        "docker": {**docker_facts(runtime), "gpu_requests": config.gpu_requests},
        "secret_names": secret_names_available(directory=config.secrets_dir)}
    if telemetry.available:
        report["gpus"] = [{"index": g.index, "name": g.name, "uuid": g.uuid,
                           "memory_total_gb": g.memory_total_gb} for g in telemetry.gpus]
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


class HostBuildRefused(RuntimeError):
    """This host cannot build the placement's image as the panel has it (no such recipe
    here, or one with another lock): the message says what to fix."""


BUILD_SHIP_EVENTS = 200  # a build's output goes to the panel in batches of this many ...
BUILD_SHIP_S = 0.5  # ... or after this long, whichever comes first


def host_image(placement: Mapping[str, Any], config: RemoteSettings, runtime: EngineRuntime,
               ship: Any, cancel: threading.Event) -> str:
    """The placement's engine image, built on this host's Docker from the recipe its spec
    names (the panel builds none for a joined host: web/builder/builds.py), or found built
    already; its build events shipped in batches through `ship`. The recipe is this host's
    (a site recipe in `recipes_dir` wins over a shipped one, as on the panel); its lock must
    be the panel's (`lock_digest`), else HostBuildRefused before anything is built.
    BuildFailed and BuildCancelled as build_image raises them."""
    name = str((placement.get("spec") or {}).get("recipe") or "")
    try:
        recipe = load_site_recipe(name, config.recipes_dir)
        lock = recipe_lock_path(recipe)
    except (RecipeError, BuildError) as exc:
        raise HostBuildRefused(f"this host has no recipe {name!r} to build the engine image "
                               f"from ({exc}): give it the panel's recipe file in "
                               "APPLIANCE_RECIPES_DIR") from None
    found = lock_digest(lock.read_bytes()) if lock is not None else ""
    wanted = placement.get("lock_digest")
    if wanted is not None and found != wanted:
        raise HostBuildRefused(
            f"this host's recipe {name!r} has the lock {found or 'none'}, the panel's "
            f"{wanted or 'none'}: give the host the panel's recipe and lock files "
            "(APPLIANCE_RECIPES_DIR), or run the panel's image version here")
    bundle = Path(config.build_ca_bundle) if config.build_ca_bundle else None
    if bundle is not None and not (bundle.is_file() and bundle.stat().st_size):
        bundle = None  # compose mounts /dev/null there when no CA is set
    plan = plan_build(recipe, ca_bundle=bundle,
                      base_id=image_id(runtime.client, recipe.base_image))
    pending: Events = []
    shipped_at = time.monotonic()

    def on_event(event: BuildEvent) -> None:
        nonlocal shipped_at
        pending.append(("build", event.to_dict()))
        if len(pending) >= BUILD_SHIP_EVENTS or time.monotonic() - shipped_at > BUILD_SHIP_S:
            ship(pending[:])
            pending.clear()
            shipped_at = time.monotonic()

    try:
        return build_image(plan, client=runtime.client,
                           no_cache=bool(placement.get("rebuild_image")), cancel=cancel,
                           on_event=on_event).tag
    finally:
        if pending:
            ship(pending[:])


def image_lock_refusal(runtime: EngineRuntime, image: str, wanted: str | None) -> str:
    """Why this image must not run here ('' when it may): its recipe lock label differs from
    the lock the panel sends. None from the panel: a configured image, no lock to match."""
    if wanted is None:
        return ""
    try:
        labels = runtime.client.images.get(image).labels or {}
    except Exception:  # noqa: BLE001 - missing image: the start says so in its own words
        return ""
    found = labels.get(LOCK_LABEL, "")
    if found == wanted:
        return ""
    return (f"image {image} was built from another recipe lock ({found or 'none'}) than the "
            f"panel's ({wanted or 'none'}): rebuild it from the panel's recipe on this host")


@dataclass
class Batch:
    """Events in order and each one's JSON (panel_link.event_json), made once: its length
    sizes the batch and the text goes into the body (events_body)."""

    events: Events = field(default_factory=list)
    encoded: list[str] = field(default_factory=list)


def batches(events: Events, limit: int = MAX_BATCH_BYTES) -> list[Batch]:
    """The events in order, in batches whose JSON stays under `limit` bytes."""
    encoded = [event_json(kind, payload) for kind, payload in events]
    sizes = [len(text) + 1 for text in encoded]  # and its comma
    if sum(sizes) <= limit:
        return [Batch(events, encoded)]
    out: list[Batch] = []
    first = size = 0
    for i, cost in enumerate(sizes):
        if i > first and size + cost > limit:
            out.append(Batch(events[first:i], encoded[first:i]))
            first, size = i, 0
        size += cost
    out.append(Batch(events[first:], encoded[first:]))
    return out


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

    def __init__(self, placement: Mapping[str, Any], agent: RemoteAgent,
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

    def ship(self, events: Events, cursor: Cursor | None) -> None:
        changed = False
        for kind, payload in events:
            if kind in ("progress", "selfcheck"):
                changed = progress_fold(self.progress, payload) or changed
        decode = next((p for k, p in reversed(events)
                       if k == "metric" and p.get("kind") == "decode_stats"), None)
        parts = batches(masked(host_kinds(events), self.key))
        for i, part in enumerate(parts):
            # Every batch moves the row's cursor: the one that ends at the follower's cursor
            # to it, any other (a part of a large batch, one with no line) to a marked one.
            moved = cursor.encode() if cursor is not None and i == len(parts) - 1 else ""
            if not moved or moved == self.stored_cursor:
                moved = cursor_marked(self.stored_cursor)
            row: dict[str, Any] = {"log_cursor": moved}
            if i == len(parts) - 1:
                if changed:
                    row["progress"] = self.progress
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

    def ready(self, engine_url: str) -> bool:
        self.status, self.engine_url = Status.READY, engine_url
        return self._step("ready", engine_url=engine_url)

    def failed(self, diagnosis: Diagnosis, message: str, last_lines: list[str]) -> None:
        log.warning("deployment %s: %s (%s)", self.pk, message, diagnosis.cause)
        self.agent.runtime.stop(self.identity, timeout_s=self.agent.config.stop_timeout_s)
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
    """The engine's monitor as the panel's agent makes its own (monitoring.monitor_start),
    with the panel's interval and stall limit (`settings`, from its placements answer)."""
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
        self.runtime.stop(identity, timeout_s=self.config.stop_timeout_s)
        RemoteSink(placement, self, stop, identity)._step("stopped")


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
