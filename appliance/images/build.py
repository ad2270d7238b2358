"""Engine image builds: a recipe becomes a content-addressed, streamed, cancellable build.

The tag is a hash of everything that goes into the image (the recipe, its patch files,
the Dockerfile template and the helper scripts), so an existing tag means an identical
image and the build is skipped. Builds go through docker-py's low-level API so every
`Step i/N`, download progress line and error reaches the caller as a BuildEvent.

CA bundle (TLS-intercepting proxies): the daemon here is the legacy builder, which has
no build secrets and no `RUN --mount`. We pass the PEM as the build arg
APPLIANCE_CA_PEM_0..3 (a build arg becomes one environment string of the RUN command,
and Linux refuses a single one over 128 KiB, while a distribution's whole bundle is about
200 KiB); `with-ca.sh` joins them into a temporary file for the download commands
only and deletes it in the same RUN, so no layer's filesystem holds it. The honest
caveat: the legacy builder records build-arg values in the image history (`docker
history --no-trunc`). A CA certificate is public (its key never leaves the proxy), so we
accept that rather than a multi-stage copy that would double the multi-GB layers. The
bundle is not part of the tag: it changes how files are fetched, not what is installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO_ROOT / "docker" / "engine"
PATCHES_DIR = Path(__file__).resolve().parent / "patches"
GPUCHECK_FILE = Path(__file__).resolve().parent / "gpucheck.py"
DEFAULT_BASE_IMAGE = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
PATCH_FAILED_MARKER = "APPLIANCE_PATCH_FAILED"
CA_ARG_PREFIX = "APPLIANCE_CA_PEM_"
CA_ARG_COUNT = 4  # as many ARG lines as docker/engine/Dockerfile declares
CA_CHUNK_BYTES = 96 * 1024  # under Linux's 128 KiB limit for one environment string
LAST_LINES = 30

STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
RUNNING_IN_RE = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})\s*$")


class SGLangSourceLike(Protocol):
    pip: str | None
    git: str | None
    ref: str | None


class RecipeLike(Protocol):
    """What a build needs from appliance.recipes.Recipe (structural, so tests and the
    recipe loader stay decoupled)."""

    name: str
    base_image: str
    sglang: Any  # SGLangSourceLike
    patches: list[str]
    pip_extras: list[str]
    env: dict[str, str]
    build_args: dict[str, str]
    path: Path | None


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
class BuildPlan:
    tag: str
    files: dict[str, bytes]  # build context: archive path -> content
    buildargs: dict[str, str]
    labels: dict[str, str]


@dataclasses.dataclass(frozen=True)
class BuildResult:
    tag: str
    cached: bool
    elapsed_s: float


class BuildError(RuntimeError):
    pass


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


# ---------------------------------------------------------------- planning


def engine_repo() -> str:
    return os.environ.get("APPLIANCE_ENGINE_REPO", "appliance-engine")


IMAGE_FIELDS = ("name", "base_image", "patches", "pip_extras", "env", "build_args")
SOURCE_FIELDS = ("pip", "git", "ref")


def _recipe_dict(recipe: RecipeLike) -> dict[str, Any]:
    """The recipe fields that change the image; where the file lives, its description
    and engine defaults do not."""
    data = {key: getattr(recipe, key) for key in IMAGE_FIELDS}
    data["sglang"] = {key: getattr(recipe.sglang, key, None) for key in SOURCE_FIELDS}
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _manifest_files(patches_dir: Path) -> dict[str, str]:
    manifest = patches_dir / "manifest.yaml"
    if not manifest.exists():
        return {}
    entries = (yaml.safe_load(manifest.read_text()) or {}).get("patches", [])
    return {e["name"]: e["file"] for e in entries}


def resolve_patch(entry: str, recipe: RecipeLike, patches_dir: Path = PATCHES_DIR) -> Path:
    """A recipe names a patch from the manifest, or gives a path (absolute or relative
    to the recipe file)."""
    by_name = _manifest_files(patches_dir)
    if entry in by_name:
        return patches_dir / by_name[entry]
    candidates = [Path(entry)]
    if recipe.path is not None:
        candidates.insert(0, Path(recipe.path).parent / entry)
    candidates.append(patches_dir / entry)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(by_name)) or "none"
    raise BuildError(f"patch {entry!r} is neither in the manifest ({known}) nor a file")


def _local_git_dir(url: str | None) -> Path | None:
    """A git source on this machine is archived into the build context (no network)."""
    if not url:
        return None
    path = Path(url.removeprefix("file://"))
    return path if path.is_absolute() and path.exists() else None


def _git(repo: Path, *args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} in {repo}: {proc.stderr.decode().strip()}")
    return proc.stdout


def _local_source_files(repo: Path, ref: str | None) -> dict[str, bytes]:
    commit = _git(repo, "rev-parse", "--verify", f"{ref or 'HEAD'}^{{commit}}").decode().strip()
    return {"src/sglang.tar": _git(repo, "archive", "--format=tar", commit),
            "src/sglang.ref": f"{repo}@{commit}\n".encode()}


def _render_dockerfile(recipe: RecipeLike, extra_steps: Sequence[str]) -> bytes:
    text = (ENGINE_DIR / "Dockerfile").read_text()
    env_lines = [f"ENV {k}={json.dumps(v)}" for k, v in sorted(recipe.env.items())]
    text = text.replace("# @RECIPE_ENV@", "\n".join(env_lines))
    text = text.replace("# @EXTRA_STEPS@", "\n".join(extra_steps))
    return text.encode()


def _tree_files(directory: Path, prefix: str) -> dict[str, bytes]:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {f"{prefix}/{p.relative_to(directory).as_posix()}": p.read_bytes() for p in files}


def _context_files(
    recipe: RecipeLike, patches: list[Path], extra_steps: Sequence[str], gpucheck: Path | None
) -> dict[str, bytes]:
    files = {"Dockerfile": _render_dockerfile(recipe, extra_steps), "src/.keep": b""}
    files |= _tree_files(ENGINE_DIR / "tools", "tools")
    files |= _tree_files(ENGINE_DIR / "runtime", "runtime")
    if gpucheck is not None and gpucheck.is_file():
        files["runtime/gpucheck.py"] = gpucheck.read_bytes()
    files["patches/series"] = "".join(f"{p.name}\n" for p in patches).encode()
    files |= {f"patches/{p.name}": p.read_bytes() for p in patches}
    if (PATCHES_DIR / "manifest.yaml").exists():
        files["patches/manifest.yaml"] = (PATCHES_DIR / "manifest.yaml").read_bytes()
    local = _local_git_dir(recipe.sglang.git)
    if local is not None:
        files |= _local_source_files(local, recipe.sglang.ref)
    return files


def _buildargs(recipe: RecipeLike, local_source: bool) -> dict[str, str]:
    src = recipe.sglang
    args = {
        "BASE_IMAGE": recipe.base_image or DEFAULT_BASE_IMAGE,
        "SGLANG_PIP": src.pip or "",
        "SGLANG_GIT": "" if local_source else (src.git or ""),
        "SGLANG_REF": src.ref or "",
        "PIP_EXTRAS": " ".join(recipe.pip_extras),
    }
    return args | dict(recipe.build_args)


def _content_tag(recipe: RecipeLike, files: Mapping[str, bytes], args: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(_recipe_dict(recipe), sort_keys=True).encode())
    digest.update(json.dumps(dict(args), sort_keys=True).encode())
    for name in sorted(files):
        digest.update(f"\0{name}\0{len(files[name])}\0".encode())
        digest.update(files[name])
    slug = re.sub(r"[^a-z0-9_.-]+", "-", recipe.name.lower()).strip("-.") or "recipe"
    return f"{engine_repo()}:{slug[:100]}-{digest.hexdigest()[:12]}"


def plan_build(
    recipe: RecipeLike,
    *,
    ca_bundle: Path | None = None,
    patches_dir: Path = PATCHES_DIR,
    gpucheck: Path | None = GPUCHECK_FILE,
    extra_steps: Sequence[str] = (),
) -> BuildPlan:
    """Everything a build sends to the daemon, and the tag it will carry.

    extra_steps are Dockerfile lines placed after the SGLang install (site hooks; the
    tests use one to make a slow step to cancel). They are part of the tag.
    """
    patches = [resolve_patch(entry, recipe, patches_dir) for entry in recipe.patches]
    files = _context_files(recipe, patches, extra_steps, gpucheck)
    args = _buildargs(recipe, _local_git_dir(recipe.sglang.git) is not None)
    tag = _content_tag(recipe, files, args)
    if ca_bundle is not None:
        args |= ca_buildargs(Path(ca_bundle).read_text())
    labels = {"appliance.recipe": recipe.name, "appliance.content-tag": tag}
    return BuildPlan(tag=tag, files=files, buildargs=args, labels=labels)


def ca_buildargs(pem: str) -> dict[str, str]:
    """A CA bundle as the build args with-ca.sh joins back together, in order."""
    chunks = [pem[i:i + CA_CHUNK_BYTES] for i in range(0, len(pem), CA_CHUNK_BYTES)]
    if len(chunks) > CA_ARG_COUNT:
        limit = CA_ARG_COUNT * CA_CHUNK_BYTES // 1024
        raise BuildError(f"the CA bundle is {len(pem) // 1024} KiB; at most {limit} KiB fits "
                         "in the build: pass only the proxy's CA certificate")
    return {f"{CA_ARG_PREFIX}{i}": chunk for i, chunk in enumerate(chunks)}


def context_tar(files: Mapping[str, bytes]) -> io.BytesIO:
    """An in-memory, reproducible tar of the build context (fixed mtimes and owners)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mode = 0o755 if name.endswith((".sh", ".py")) else 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    buf.seek(0)
    return buf


# ---------------------------------------------------------------- building


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
    import docker.errors

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


def image_exists(client: Any, tag: str) -> bool:
    import docker.errors

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
