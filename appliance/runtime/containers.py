"""Engine containers through docker-py: start (or adopt), follow logs, inspect, stop.

A container carries its identity in labels and name: the install's instance id, the
deployment id and a per-start token. A restarted agent adopts a running engine only when
all three match, so a container made by hand with our labels, another appliance's engine
on the same Docker engine, or one left from a reset database is never adopted or stopped.
No Django, no Celery: plain dataclasses in and out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import docker.errors
from docker.client import DockerClient, from_env
from docker.models.containers import Container

from appliance.runtime.container_plan import (
    COMPOSE_PROJECT,
    COMPOSE_SERVICE,
    ENGINE_API_KEY_SECRET,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    ContainerPlan,
    Identity,
    container_name,
    docker_run_kwargs,
)
from appliance.runtime.logstream import LogLine, attach_frames, lines_of, log_frames
from appliance.runtime.secrets import SecretMissingError, resolve_secrets, secrets_archive

log = logging.getLogger(__name__)
# A container in one of these states is (or is about to be) the deployment's engine.
LIVE_STATES = frozenset({"created", "running", "restarting", "paused"})
# The engine network is closed: an engine's HTTP port has no key (SGLang's /server_info even
# returns its api_key), so only the network's members (the agent, the gateway in web, the
# worker's benchmark jobs) may reach it. `internal` stops traffic to and from other
# networks, and with no address on the bridge the host itself has no route to it either
# (an internal bridge alone still lets the host connect to every engine).
INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"
ENGINE_NETWORK_OPTIONS: dict[str, Any] = {
    "driver": "bridge", "internal": True, "options": {INHIBIT_IPV4: "true"}}


class EngineRuntimeError(RuntimeError):
    """A Docker operation on an engine container failed; the message says what to do."""


class ImageMissingError(EngineRuntimeError):
    """The engine image is not on this Docker engine (there is no registry to pull from)."""


def _identity(target: str | Identity) -> Identity:
    return target if isinstance(target, Identity) else Identity(str(target))


class EngineRuntime:
    """Starts, adopts, watches and stops engine containers on one Docker engine."""

    def __init__(self, client: DockerClient | None = None) -> None:
        self._client = client

    @property
    def client(self) -> DockerClient:
        # Connect lazily so that constructing a runtime never needs a daemon.
        if self._client is None:
            try:
                self._client = from_env()
            except docker.errors.DockerException as exc:
                raise EngineRuntimeError(f"cannot reach the Docker engine: {exc}") from exc
        return self._client

    container_name = staticmethod(container_name)

    def find(self, target: str | Identity) -> Container | None:
        """The container with this identity in any state; a live one wins over leftovers."""
        found = self._matching(_identity(target))
        live = [c for c in found if c.status in LIVE_STATES]
        return (live or found or [None])[0]

    def list_managed(self) -> list[Container]:
        """Every container carrying the appliance's labels, in any state."""
        return self._by_label(f"{LABEL_MANAGED}=1")

    def ensure_started(self, plan: ContainerPlan) -> Container:
        """Adopt the deployment's live container, or start one (removing an exited leftover)."""
        existing = self.find(plan.identity)
        # A container never started may lack its secret files (the agent stopped between
        # create and start): it is made again rather than started.
        if existing is not None and existing.status in LIVE_STATES - {"created"}:
            return existing
        if existing is not None:
            self._remove(existing)
        return self._run(plan)

    def engine_url(self, container: Container, plan: ContainerPlan) -> str:
        """Base URL the worker uses for the engine's HTTP API."""
        if plan.network:
            return f"http://{container.name}:{plan.container_port}"
        host_port = self._host_port(container, plan.container_port)
        host = "127.0.0.1" if plan.publish_host in ("", "0.0.0.0") else plan.publish_host
        return f"http://{host}:{host_port}"

    def state(self, container: Container) -> tuple[str, int | None]:
        """(Docker status, exit code once it has exited); ("missing", None) when removed."""
        try:
            container.reload()
        except docker.errors.NotFound:
            return "missing", None
        status = str(container.attrs["State"]["Status"])
        if status in ("exited", "dead"):
            return status, int(container.attrs["State"]["ExitCode"])
        return status, None

    def stop(self, target: str | Identity, timeout_s: float = 30) -> bool:
        """docker stop (SIGTERM, then SIGKILL after timeout_s) and remove; False if none.

        Only containers matching the whole identity are stopped.
        """
        containers = self._matching(_identity(target))
        for container in containers:
            try:
                if container.status in LIVE_STATES:
                    container.stop(timeout=int(max(timeout_s, 0)))
                self._remove(container)
            except docker.errors.NotFound:
                continue  # someone else removed it first: the goal is reached
            except docker.errors.APIError as exc:
                raise EngineRuntimeError(f"cannot stop {container.name}: {exc}") from exc
        return bool(containers)

    def ensure_network(self, name: str) -> Any:
        """The engines' own network, made once; it outlives the appliance's containers so
        that `docker compose down` leaves running engines (and their network) alone.

        It is closed (see ENGINE_NETWORK_OPTIONS): only its members reach an engine. A
        network of that name left open by an older version is made again while nothing is
        on it; with engines on it, it is kept and a warning says how to close it.
        """
        network = self._one_network(name)
        if network is None:
            return self._create_network(name)
        if network_is_closed(network.attrs):
            return network
        try:
            network.remove()
        except docker.errors.NotFound:
            pass  # the worker or the agent, starting beside us, removed it first
        except docker.errors.APIError as exc:
            log.warning(open_network_warning(name, exc.explanation or str(exc)))
            network.reload()
            return network
        log.warning("engine network %s was open to the host (made by an older version); "
                    "made again as an internal network", name)
        return self._create_network(name)

    def _create_network(self, name: str) -> Any:
        # The agent and the worker both make it at start; older daemons (API < 1.44) allow
        # two networks of one name unless asked to check, and then the loser takes the
        # winner's.
        try:
            made = self.client.networks.create(name, check_duplicate=True,
                                               labels={LABEL_MANAGED: "1"},
                                               **ENGINE_NETWORK_OPTIONS)
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
            made = None
        return self._one_network(name) or made

    def _one_network(self, name: str) -> Any:
        """The network of that name, or None. The daemon's duplicate check is not atomic:
        two processes making it at once can make two, and then every use of the name is
        refused as ambiguous. Each caller keeps the same one (the oldest, then the lowest
        id) and removes the others while nothing is on them."""
        found = sorted((n for n in self.client.networks.list(names=[name]) if n.name == name),
                       key=lambda n: (str(n.attrs.get("Created", "")), n.id))
        if not found:
            return None
        for extra in found[1:]:
            try:
                extra.remove()
                log.warning("engine network %s: a second network of that name (%s), made at "
                            "the same moment by another process, removed", name, extra.short_id)
            except docker.errors.NotFound:
                pass  # another process removed it first
            except docker.errors.APIError as exc:
                log.warning("engine network %s: a second network of that name (%s) could not "
                            "be removed: %s", name, extra.short_id, exc.explanation or exc)
        return self.client.networks.get(found[0].id)

    def join_network(self, network: Any, container_ref: str) -> bool:
        """Connect a container (id or name) to the network; False when it is no container."""
        try:
            container = self.client.containers.get(container_ref)
        except docker.errors.NotFound:
            return False
        network.reload()
        if container.id in {c.id for c in network.containers}:
            return True
        network.connect(container)
        return True

    def compose_peers(self, container_ref: str, service: str) -> list[str]:
        """The containers of `service` in the same compose project as this container (by
        compose's own labels); none when it is no compose container."""
        try:
            labels = self.client.containers.get(container_ref).labels or {}
        except docker.errors.NotFound:
            return []
        project = labels.get(COMPOSE_PROJECT)
        if not project:
            return []
        peers = self.client.containers.list(ignore_removed=True, filters={"label": [
            f"{COMPOSE_PROJECT}={project}", f"{COMPOSE_SERVICE}={service}"]})
        return [c.id for c in peers]

    def exit_state(self, container: Container) -> dict[str, Any]:
        """Docker's account of how the container ended: exit code, OOM kill, error."""
        try:
            container.reload()
        except docker.errors.NotFound:
            return {"status": "missing"}
        state = container.attrs.get("State") or {}
        return {"status": state.get("Status"), "exit_code": state.get("ExitCode"),
                "oom_killed": bool(state.get("OOMKilled")), "error": state.get("Error") or ""}

    def follow_logs(
        self,
        container: Container,
        since: float | None = None,
        partials: bool = False,
        timestamps: bool = False,
        follow: bool = True,
    ) -> Iterator[LogLine]:
        """Follow the container's output until it exits, stdout and stderr kept apart.

        `since` is a Unix time (resume after a worker restart). Docker's log driver hands
        out a line only once its "\\n" arrives, so a tqdm bar redrawing with "\\r" shows
        no progress until it closes. With `partials` (and no `since`) this attaches to
        the running container instead: earlier output comes as whole lines, and what is
        written from now on arrives as written, the unterminated pieces of a line
        yielded as partial LogLines for live progress; whole lines come either way.
        Without `follow`, it ends at what Docker has stored so far.
        """
        if partials:
            container.reload()  # a container just run still says "created"
        live = (follow and partials and since is None and container.status == "running"
                and not timestamps)
        try:
            frames = (attach_frames(self.client.api, container.id) if live
                      else log_frames(self.client.api, container.id, since, timestamps,
                                      follow=follow, runs=True))
            yield from lines_of(frames, partials, timestamps)
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(f"cannot follow {container.name}: {exc}") from exc

    # ------------------------------------------------------------------ internals

    def _matching(self, identity: Identity) -> list[Container]:
        found = self._by_label([f"{k}={v}" for k, v in identity.labels().items()])
        if identity.instance_id:
            return found
        # Without an instance id (bare runtime use): never touch another install's engines.
        return [c for c in found if LABEL_INSTANCE not in (c.labels or {})]

    def _by_label(self, label: str | list[str]) -> list[Container]:
        # docker-py lists ids, then inspects each: a container removed in between (a stop,
        # another install's cleanup) is skipped, not a NotFound that ends the agent's tick.
        try:
            found = self.client.containers.list(all=True, filters={"label": label},
                                                ignore_removed=True)
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(f"cannot list containers ({label}): {exc}") from exc
        return list(found)

    def _run(self, plan: ContainerPlan) -> Container:
        """Create, put the secret files in, then start: no value is ever in the container's
        configuration (`docker inspect`), only in files the entrypoint exports and removes."""
        self._require_image(plan.image)
        values = secret_values(plan)
        if plan.api_key:
            values[ENGINE_API_KEY_SECRET] = plan.api_key
        archive = secrets_archive(values)
        kwargs = docker_run_kwargs(plan)
        del kwargs["detach"]
        container = None
        try:
            container = self.client.containers.create(**kwargs)
            if archive:
                container.put_archive("/", archive)
            container.start()
        except docker.errors.ImageNotFound as exc:
            raise ImageMissingError(_image_missing_message(plan.image)) from exc
        except docker.errors.APIError as exc:
            if container is not None:
                self._remove(container)
            raise EngineRuntimeError(
                f"cannot start the engine container {plan.identity.name} "
                f"from image {plan.image}: {exc.explanation or exc}"
            ) from exc
        container.reload()
        return container

    def _require_image(self, image: str) -> None:
        # Checked first: `run` would otherwise try a registry pull, which cannot work here.
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound as exc:
            raise ImageMissingError(_image_missing_message(image)) from exc
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(f"cannot inspect image {image}: {exc}") from exc

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass  # already gone
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc):
                self._wait_gone(container)  # another stop got there first
                return
            raise EngineRuntimeError(f"cannot remove {container.name}: {exc}") from exc

    def _wait_gone(self, container: Container, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                container.reload()
            except docker.errors.NotFound:
                return
            time.sleep(0.1)
        raise EngineRuntimeError(f"{container.name} is still being removed after {timeout_s}s")

    def _call(self, func: Any, what: str) -> None:
        try:
            func()
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(f"cannot {what}: {exc}") from exc

    def _host_port(self, container: Container, container_port: int) -> str:
        # Docker fills the port map a moment after start; re-read briefly.
        for _ in range(20):
            container.reload()
            ports = container.attrs["NetworkSettings"]["Ports"] or {}
            bindings = ports.get(f"{container_port}/tcp") or []
            if bindings and bindings[0].get("HostPort"):
                return str(bindings[0]["HostPort"])
            if container.status not in LIVE_STATES:
                break
            time.sleep(0.1)
        raise EngineRuntimeError(
            f"container {container.name} has no published port for {container_port}/tcp "
            f"(status {container.status}); was it started with a network instead?"
        )

def network_is_closed(attrs: Mapping[str, Any]) -> bool:
    """Whether a network (Docker's inspect) reaches no one but its members."""
    options = attrs.get("Options") or {}
    return bool(attrs.get("Internal")) and str(options.get(INHIBIT_IPV4, "")).lower() == "true"


def open_network_warning(name: str, reason: str) -> str:
    """What to do about an engine network an older version left open, with engines on it."""
    return (f"engine network {name} is open to the host (made by an older version): its "
            f"engines answer anyone on this machine without an API key. It cannot be made "
            f"again while containers use it ({reason}). Stop its deployments (or "
            f"`docker rm -f` their containers), `docker network rm {name}`, then restart the "
            "agent and the worker (`docker compose restart agent worker`).")


def secret_values(plan: ContainerPlan,
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The declared secrets' values, read from the store now (never kept in the plan);
    EngineRuntimeError naming (never showing) a secret that cannot be had."""
    try:
        return resolve_secrets(plan.secrets, directory=plan.secrets_dir, environ=environ)
    except SecretMissingError as exc:
        raise EngineRuntimeError(f"cannot start {plan.identity.name}: {exc}") from None


def _image_missing_message(image: str) -> str:
    return (
        f"image {image!r} is not on this Docker engine and no registry is used. Build it "
        "first: the test engine with `docker build -t appliance-test-engine:latest "
        "--build-arg BASE_IMAGE=appliance-base:bookworm docker/test-engine`, an SGLang "
        "engine image through the appliance's build step (appliance/images/plan.py)."
    )
