"""Engine image builds: a plan (appliance.images.plan) becomes a streamed, cancellable build.

Builds go through docker-py's low-level API so every `Step i/N`, download progress line
and error reaches the caller as a BuildEvent. An image whose content tag exists is not
built again. A cancel kills the running step's container at once, since a RUN step can
stay silent for minutes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import docker.errors
from docker.errors import ImageNotFound

from appliance.images.plan import BuildError, BuildPlan, context_tar

PATCH_FAILED_MARKER = "APPLIANCE_PATCH_FAILED"
LAST_LINES = 30

STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
RUNNING_IN_RE = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})\s*$")


@dataclasses.dataclass(frozen=True)
class BuildEvent:
    kind: str  # cache_hit | build_step | build_progress | build_log | built
    text: str
    step: int | None = None
    total: int | None = None
    progress: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class BuildResult:
    tag: str
    cached: bool
    elapsed_s: float


class BuildFailed(BuildError):
    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        step_text: str | None = None,
        last_output_lines: Sequence[str] = (),
        patch: str | None = None,
        file: str | None = None,
        hunk: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.step = step
        self.step_text = step_text
        self.last_output_lines = list(last_output_lines)
        self.patch = patch
        self.file = file
        self.hunk = hunk

    def to_dict(self) -> dict[str, Any]:
        keys = ("message", "step", "step_text", "last_output_lines", "patch", "file", "hunk")
        return {k: getattr(self, k) for k in keys}


class BuildCancelled(BuildError):
    def __init__(self, container_ids: Sequence[str] = ()) -> None:
        super().__init__("build cancelled")
        self.container_ids = list(container_ids)


class _StreamState:
    """What the stream told us so far: current step, recent output, the RUN container."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.total: int | None = None
        self.step_text: str | None = None
        self.lines: deque[str] = deque(maxlen=LAST_LINES)
        self.containers: list[str] = []
        self.lock = threading.Lock()


def _events_for(chunk: Mapping[str, Any], state: _StreamState) -> Iterator[BuildEvent]:
    if "stream" in chunk:
        for line in str(chunk["stream"]).splitlines():
            yield from _stream_line(line, state)
    elif "status" in chunk:
        detail = chunk.get("progressDetail") or {}
        text = " ".join(str(chunk[k]) for k in ("id", "status", "progress") if chunk.get(k))
        if detail:
            yield BuildEvent("build_progress", text, state.step, state.total, dict(detail))
        else:
            yield BuildEvent("build_log", text, state.step, state.total)


def _stream_line(line: str, state: _StreamState) -> Iterator[BuildEvent]:
    if not line.strip():
        return
    if m := STEP_RE.match(line):
        state.step, state.total, state.step_text = int(m[1]), int(m[2]), m[3]
        yield BuildEvent("build_step", m[3], state.step, state.total)
        return
    if m := RUNNING_IN_RE.match(line):
        with state.lock:
            state.containers.append(m[1])
    state.lines.append(line)
    yield BuildEvent("build_log", line, state.step, state.total)


def _patch_failure(lines: Iterable[str]) -> dict[str, Any]:
    for line in reversed(list(lines)):
        if line.startswith(PATCH_FAILED_MARKER):
            with contextlib.suppress(ValueError):
                return dict(json.loads(line[len(PATCH_FAILED_MARKER):].strip()))
    return {}


def _failed(chunk: Mapping[str, Any], state: _StreamState) -> BuildFailed:
    detail = chunk.get("errorDetail") or {}
    message = str(detail.get("message") or chunk.get("error") or "build failed").strip()
    patch = _patch_failure(state.lines)
    if patch:
        message = (f"patch {patch.get('patch')} does not apply: file {patch.get('file')}, "
                   f"hunk #{patch.get('hunk')} ({message})")
    return BuildFailed(
        message, step=state.step, step_text=state.step_text,
        last_output_lines=list(state.lines), patch=patch.get("patch"),
        file=patch.get("file"), hunk=patch.get("hunk"),
    )


def _kill_containers(client: Any, ids: Iterable[str]) -> None:
    """Stop the legacy builder's RUN containers; it removes them itself (forcerm), and
    we remove them too in case the daemon lost track once the client went away."""

    for cid in ids:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            client.api.kill(cid)
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            client.api.remove_container(cid, force=True)


def _cancel_watch(
    client: Any, cancel: threading.Event, state: _StreamState, done: threading.Event
) -> None:
    """Kills the step's container as soon as cancel is set: a RUN step can stay silent for
    minutes, so waiting for the next stream chunk would not be prompt. Keeps killing any
    step the daemon starts until the stream has ended."""
    killed: set[str] = set()
    while not done.is_set():
        if cancel.is_set():
            with state.lock:
                todo = [c for c in state.containers if c not in killed]
            _kill_containers(client, todo)
            killed.update(todo)
        done.wait(0.2)


def image_id(client: Any, name: str) -> str | None:
    """The local image's id (sha256:...), or None when the daemon does not have it."""

    try:
        return str(client.images.get(name).id)
    except ImageNotFound:
        return None


def image_exists(client: Any, tag: str) -> bool:
    try:
        client.api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _stream(
    client: Any, plan: BuildPlan, no_cache: bool
) -> Iterator[Mapping[str, Any]]:
    return client.api.build(  # type: ignore[no-any-return]
        fileobj=context_tar(plan.files), custom_context=True, decode=True, rm=True,
        forcerm=True, tag=plan.tag, buildargs=plan.buildargs, nocache=no_cache,
        labels=plan.labels,
    )


def _consume(
    stream: Iterator[Mapping[str, Any]],
    state: _StreamState,
    emit: Callable[[BuildEvent], None],
    cancel: threading.Event,
) -> None:
    for chunk in stream:
        if cancel.is_set():
            raise BuildCancelled(state.containers)
        if "error" in chunk or "errorDetail" in chunk:
            raise _failed(chunk, state)
        for event in _events_for(chunk, state):
            emit(event)
    if cancel.is_set():
        raise BuildCancelled(state.containers)


def build_image(
    plan: BuildPlan,
    *,
    client: Any,
    no_cache: bool = False,
    cancel: threading.Event | None = None,
    on_event: Callable[[BuildEvent], None] | None = None,
) -> BuildResult:
    """Builds plan.tag unless it exists (then returns at once, cached=True).

    Raises BuildFailed (step, its last output, and the patch/file/hunk when a patch did
    not apply) or BuildCancelled (after the running step's container is gone).
    """
    emit = on_event or (lambda _event: None)
    started = time.monotonic()
    if not no_cache and image_exists(client, plan.tag):
        emit(BuildEvent("cache_hit", f"image {plan.tag} already built; skipping the build"))
        return BuildResult(plan.tag, cached=True, elapsed_s=time.monotonic() - started)
    cancel = cancel or threading.Event()
    state, done = _StreamState(), threading.Event()
    watcher = threading.Thread(
        target=_cancel_watch, args=(client, cancel, state, done), daemon=True
    )
    watcher.start()
    stream = _stream(client, plan, no_cache)
    try:
        _consume(stream, state, emit, cancel)
    finally:
        done.set()
        cancel_set = cancel.is_set()
        with contextlib.suppress(Exception):
            stream.close()  # type: ignore[attr-defined]
        if cancel_set:
            _kill_containers(client, state.containers)
    elapsed = time.monotonic() - started
    emit(BuildEvent("built", f"built {plan.tag} in {elapsed:.1f} s", state.step, state.total))
    return BuildResult(plan.tag, cached=False, elapsed_s=elapsed)
