"""Engine containers through docker-py: start (or adopt), follow logs, inspect, stop.

A container carries its identity in labels and name: the install's instance id, the
deployment id and a per-start token. A restarted agent adopts a running engine only when
all three match, so a container made by hand with our labels, another appliance's engine
on the same Docker engine, or one left from a reset database is never adopted or stopped.
No Django, no Celery: plain dataclasses in and out.
"""

from __future__ import annotations

import codecs
import itertools
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import docker.errors
from docker.client import DockerClient, from_env
from docker.models.containers import Container
from docker.types import DeviceRequest
from docker.utils.socket import frames_iter

LABEL_DEPLOYMENT = "appliance.deployment"
LABEL_MANAGED = "appliance.managed"
LABEL_INSTANCE = "appliance.instance"
LABEL_START = "appliance.start-token"
NAME_PREFIX = "appliance-engine-"
# A container in one of these states is (or is about to be) the deployment's engine.
LIVE_STATES = frozenset({"created", "running", "restarting", "paused"})
STREAM_NAMES: dict[int, Literal["stdout", "stderr"]] = {1: "stdout", 2: "stderr"}

StreamName = Literal["stdout", "stderr"]


class EngineRuntimeError(RuntimeError):
    """A Docker operation on an engine container failed; the message says what to do."""


class ImageMissingError(EngineRuntimeError):
    """The engine image is not on this Docker engine (there is no registry to pull from)."""


@dataclass
class ContainerPlan:
    """Everything needed to start one deployment's engine container."""

    deployment_id: str
    image: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)
    container_port: int = 30000
    # With a network the worker reaches the engine by container name and nothing is
    # published; without one the port is published on publish_host (loopback) only.
    network: str | None = None
    publish_host: str = "127.0.0.1"
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    # None means ipc_mode="host", which SGLang's docs recommend over a sized /dev/shm.
    shm_size: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # Identity (see the module docstring); empty in tests that start bare containers.
    instance_id: str = ""
    start_token: str = ""

    @property
    def identity(self) -> Identity:
        return Identity(str(self.deployment_id), self.instance_id, self.start_token)


@dataclass(frozen=True)
class Identity:
    """Which engine container is a deployment's: all given parts must match."""

    deployment_id: str
    instance_id: str = ""
    start_token: str = ""

    def labels(self) -> dict[str, str]:
        labels = {LABEL_DEPLOYMENT: self.deployment_id, LABEL_MANAGED: "1"}
        if self.instance_id:
            labels[LABEL_INSTANCE] = self.instance_id
        if self.start_token:
            labels[LABEL_START] = self.start_token
        return labels

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels().items())

    @property
    def name(self) -> str:
        return container_name(self.deployment_id, self.instance_id, self.start_token)


def _identity(target: str | Identity) -> Identity:
    return target if isinstance(target, Identity) else Identity(str(target))


@dataclass(frozen=True)
class LogLine:
    """One output line of an engine container, from the stream it was written to.

    `text` is a whole line without its "\\n"; tqdm's "\\r" updates stay inside it.
    `partial` lines (only with follow_logs(partials=True)) are the pieces of a line still
    being written (a progress bar redrawing with "\\r"), yielded as they arrive so
    progress is live; the whole line follows, non-partial, once its "\\n" arrives.
    Store only non-partial lines.
    """

    stream: StreamName
    text: str
    partial: bool = False
    ts_ns: int | None = None  # Docker's timestamp of the line (follow_logs(timestamps=True))


def container_name(deployment_id: str, instance_id: str = "", start_token: str = "") -> str:
    """Deterministic container name; characters Docker rejects become '-'."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", str(deployment_id))
    if not instance_id:
        return f"{NAME_PREFIX}{safe}"
    return f"{NAME_PREFIX}{instance_id[:8]}-{safe}-{start_token[:8]}"


def parse_docker_ts(text: str) -> int:
    """Docker's RFC 3339 timestamp with up to 9 fraction digits -> Unix nanoseconds."""
    import calendar

    day, _, rest = text.partition("T")
    clock = rest.rstrip("Z")
    whole, _, frac = clock.partition(".")
    y, mo, d = (int(x) for x in day.split("-"))
    h, mi, s = (int(x) for x in whole.split(":"))
    seconds = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


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
        if existing is not None and existing.status in LIVE_STATES:
            if existing.status == "created":
                self._call(existing.start, f"start container {existing.name}")
                existing.reload()
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
    ) -> Iterator[LogLine]:
        """Follow the container's output until it exits, stdout and stderr kept apart.

        `since` is a Unix time (resume after a worker restart). Docker's log driver hands
        out a line only once its "\\n" arrives, so a tqdm bar redrawing with "\\r" shows
        no progress until it closes. With `partials` (and no `since`) this attaches to
        the running container instead: earlier output comes as whole lines, and what is
        written from now on arrives as written, the unterminated pieces of a line
        yielded as partial LogLines for live progress; whole lines come either way.
        """
        splitter = _LineSplitter(partials)
        if partials:
            container.reload()  # a container just run still says "created"
        live = partials and since is None and container.status == "running" and not timestamps
        frames = (self._attach_frames(container) if live
                  else self._log_frames(container, since, timestamps))
        lines = (line for stream_id, data in frames
                 for line in splitter.feed(STREAM_NAMES.get(stream_id, "stdout"), data))
        for line in itertools.chain(lines, splitter.flush()):
            yield _with_timestamp(line) if timestamps else line

    # ------------------------------------------------------------------ internals

    def _matching(self, identity: Identity) -> list[Container]:
        found = self._by_label([f"{k}={v}" for k, v in identity.labels().items()])
        if identity.instance_id:
            return found
        # Without an instance id (bare runtime use): never touch another install's engines.
        return [c for c in found if LABEL_INSTANCE not in (c.labels or {})]

    def _by_label(self, label: str | list[str]) -> list[Container]:
        try:
            found = self.client.containers.list(all=True, filters={"label": label})
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(f"cannot list containers ({label}): {exc}") from exc
        return list(found)

    def _run(self, plan: ContainerPlan) -> Container:
        self._require_image(plan.image)
        try:
            container = self.client.containers.run(**docker_run_kwargs(plan))
        except docker.errors.ImageNotFound as exc:
            raise ImageMissingError(_image_missing_message(plan.image)) from exc
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(
                f"cannot start the engine container {plan.identity.name} "
                f"from image {plan.image}: {exc.explanation or exc}"
            ) from exc
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

    def _log_frames(
        self, container: Container, since: float | None, timestamps: bool = False
    ) -> Iterator[tuple[int, bytes]]:
        """Raw (stream id, bytes) frames of `docker logs --follow` (a non-tty container).

        docker-py's public logs() drops the stream id of each frame and attach() cannot
        start at `since`, so this issues the same request and keeps the ids. Like
        docker-py's logs(), it turns the socket timeout off: a quiet engine (a long
        weight load) is not an error.
        """
        api = self.client.api
        params: dict[str, Any] = {"stdout": 1, "stderr": 1, "follow": 1,
                                  "timestamps": int(timestamps)}
        if since is not None:
            params["since"] = f"{since:.6f}"
        try:
            response = api._get(api._url("/containers/{0}/logs", container.id),
                                params=params, stream=True)
            api._raise_for_status(response)
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(f"cannot follow logs of {container.name}: {exc}") from exc
        api._disable_socket_timeout(api._get_raw_response_socket(response))
        try:
            yield from _read_frames(response.raw)
        finally:
            response.close()

    def _attach_frames(self, container: Container) -> Iterator[tuple[int, bytes]]:
        """`docker attach` with logs: the live stdio as written, not line-buffered."""
        api = self.client.api
        params = {"logs": 1, "stdout": 1, "stderr": 1, "stream": 1}
        try:
            response = api._post(api._url("/containers/{0}/attach", container.id),
                                 headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                                 params=params, stream=True)
            api._raise_for_status(response)
        except docker.errors.APIError as exc:
            raise EngineRuntimeError(f"cannot attach to {container.name}: {exc}") from exc
        sock = api._get_raw_response_socket(response)
        api._disable_socket_timeout(sock)
        try:
            yield from _read_socket_frames(sock)
        finally:
            response.close()


def _read_socket_frames(sock: Any) -> Iterator[tuple[int, bytes]]:
    for stream_id, data in frames_iter(sock, False):
        if data:
            yield int(stream_id), bytes(data)


def _read_frames(raw: Any) -> Iterator[tuple[int, bytes]]:
    """Docker's multiplexed log stream: 8-byte header (stream id, size), then the payload."""
    while True:
        header = raw.read(8)
        if len(header) < 8:
            return
        stream_id, length = struct.unpack(">BxxxL", header)
        data = raw.read(length) if length else b""
        if length and not data:
            return
        if data:
            yield stream_id, data


class _LineSplitter:
    """Splits each stream's bytes on "\\n" (not "\\r"), decoding UTF-8 incrementally."""

    def __init__(self, partials: bool = False) -> None:
        self._partials = partials
        self._pending: dict[StreamName, str] = {"stdout": "", "stderr": ""}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in
                          self._pending}

    def feed(self, stream: StreamName, data: bytes) -> Iterator[LogLine]:
        text = self._decoders[stream].decode(data)
        pieces = (self._pending[stream] + text).split("\n")
        self._pending[stream] = pieces.pop()
        for line in pieces:
            yield LogLine(stream, line)
        tail = text.rsplit("\n", 1)[-1]
        if tail and self._partials:
            yield LogLine(stream, tail, partial=True)

    def flush(self) -> Iterator[LogLine]:
        for stream, rest in self._pending.items():
            rest += self._decoders[stream].decode(b"", final=True)
            if rest:
                yield LogLine(stream, rest)
            self._pending[stream] = ""


def _with_timestamp(line: LogLine) -> LogLine:
    """Split Docker's `<RFC 3339 time> ` prefix off a line read with timestamps."""
    stamp, sep, text = line.text.partition(" ")
    if not sep or not stamp[:4].isdigit():
        return line
    try:
        return LogLine(line.stream, text, line.partial, parse_docker_ts(stamp))
    except ValueError:
        return line


def docker_run_kwargs(plan: ContainerPlan) -> dict[str, Any]:
    """The docker-py `containers.run` arguments for a plan (pure; shown in dry runs)."""
    labels = {**plan.labels, **plan.identity.labels()}
    kwargs: dict[str, Any] = {
        "image": plan.image,
        "command": list(plan.argv),
        "name": plan.identity.name,
        "labels": labels,
        "environment": dict(plan.env),
        "detach": True,
        "volumes": plan.volumes or None,
        # An init as PID 1 forwards SIGTERM and reaps SGLang's worker processes; without
        # it a stop that lands before Python installs its handler waits the full timeout.
        "init": True,
    }
    if plan.network:
        kwargs["network"] = plan.network
    else:
        kwargs["ports"] = {f"{plan.container_port}/tcp": (plan.publish_host, None)}
    if plan.shm_size:
        kwargs["shm_size"] = plan.shm_size
    else:
        kwargs["ipc_mode"] = "host"
    if plan.gpus:
        kwargs["device_requests"] = [
            DeviceRequest(driver="nvidia", device_ids=[str(g) for g in plan.gpus],
                          capabilities=[["gpu"]])
        ]
    return kwargs


def _image_missing_message(image: str) -> str:
    return (
        f"image {image!r} is not on this Docker engine and no registry is used. Build it "
        "first: the test engine with `docker build -t appliance-test-engine:latest "
        "--build-arg BASE_IMAGE=appliance-base:bookworm docker/test-engine`, an SGLang "
        "engine image through the appliance's build step (appliance/images/plan.py)."
    )
