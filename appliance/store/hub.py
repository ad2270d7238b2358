"""Downloading a model from a Hugging Face hub into a store folder, resumably, with checks.

huggingface_hub does the talking: `HfApi.model_info(files_metadata=True)` pins the revision
to a commit and gives every file's size and, for LFS files, its sha256; `http_get` streams
one file with ranged GETs and retries transient network errors itself. The store keeps each
file's bytes in <folder>/<path>.incomplete until it is whole: huggingface_hub's own
`hf_hub_download` (2.x) writes to a per-process temporary name and deletes it on failure, so
a killed worker would start that file from zero. Here a new job opens the same .incomplete
file and asks for the rest (`Range: bytes=<size>-`), never from zero.

The token is only ever passed to huggingface_hub as an argument: it is in no message this
module makes, and errors are re-raised as StoreError with their text, which huggingface_hub
builds from the URL and the server's answer, not from the request's headers.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

PARTIAL_SUFFIX = ".incomplete"
GB = 1000**3
HASH_CHUNK = 8 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024
DEFAULT_ENDPOINT = "https://huggingface.co"
# The first request (the repo's file list): a hub that takes no connection is tried this many
# times, CONNECT_PAUSE_S apart, each request bounded by REQUEST_TIMEOUT_S; then the job says
# so instead of waiting on retries (a wrong APPLIANCE_HF_ENDPOINT, no route out).
CONNECT_TRIES = 3
CONNECT_PAUSE_S = 0.5
REQUEST_TIMEOUT_S = 10.0


class StoreError(Exception):
    """A download cannot go on; the message says why and what to do (never a secret)."""


class HubUnreachableError(StoreError):
    """The hub did not answer (network fault): worth trying again later."""


class HubNotReachedError(HubUnreachableError):
    """No connection to the hub at all (refused, a name that does not resolve, a connect
    timeout): at a job's first request this is a wrong endpoint or no network, not a blip."""


class JobInterruptedError(Exception):
    """Raised from the progress callback to stop a download on purpose; passed through."""


class DownloadCancelledError(JobInterruptedError):
    """Raised from the progress callback when the entry was cancelled."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str = ""  # the LFS sha256; the hub gives none for small git files
    git_sha1: str = ""  # a small git file's blob id: sha1 of "blob <size>\0" + its bytes


@dataclass(frozen=True)
class RepoPlan:
    repo_id: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _hub_error(exc: Exception, what: str) -> StoreError:
    from huggingface_hub.errors import (  # noqa: PLC0415 - heavy: only a download job needs the hub client
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return StoreError(f"{what} is gated: accept its terms on the hub and put a token "
                          "that may read it in the engine secret store as HF_TOKEN")
    if isinstance(exc, RevisionNotFoundError):
        return StoreError(f"{what}: no such revision on the hub; give a branch, tag or "
                          "commit the repository has")
    if isinstance(exc, RepositoryNotFoundError):
        return StoreError(f"{what}: no such repository on the hub (or it is private: put a "
                          "token that may read it in the engine secret store as HF_TOKEN)")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return StoreError(f"{what}: the hub refused access (HTTP {status}): put a token that "
                          "may read it in the engine secret store as HF_TOKEN")
    if status == 404:
        return StoreError(f"{what}: the hub has no such file (HTTP 404)")
    return HubUnreachableError(f"{what}: the hub did not answer ({type(exc).__name__}: "
                               f"{str(exc)[:300]})")


def _no_connection(exc: BaseException) -> bool:
    """A connection never made (httpx's ConnectError or ConnectTimeout, whichever HTTP
    client huggingface_hub uses): the server was never asked anything."""
    return any(k.__name__ in ("ConnectError", "ConnectTimeout") for k in type(exc).__mro__)


def _cause(exc: BaseException) -> str:
    """The operating system's words for it (connection refused, name not known, timed out)."""
    inner = exc.__cause__ or exc.__context__
    text = str(inner if isinstance(inner, OSError) and str(inner) else exc)
    return text[:300] or type(exc).__name__


def repo_plan(*, repo_id: str, revision: str, endpoint: str, token: str | None) -> RepoPlan:
    """The files of repo_id at revision, with sizes and LFS sha256, pinned to a commit."""
    from huggingface_hub import HfApi  # noqa: PLC0415 - heavy: only a download job needs the hub client

    what = f"{repo_id}@{revision}"
    api = HfApi(endpoint=endpoint, token=token or False)
    started = time.monotonic()
    for attempt in range(1, CONNECT_TRIES + 1):
        try:
            info = api.model_info(repo_id, revision=revision, files_metadata=True,
                                  timeout=REQUEST_TIMEOUT_S)
            break
        except Exception as exc:  # huggingface_hub's errors and httpx's, all turned into ours
            if not _no_connection(exc):
                raise _hub_error(exc, what) from None
            if attempt == CONNECT_TRIES:
                raise HubNotReachedError(
                    f"cannot reach the hub at {endpoint}: {_cause(exc)} ({attempt} tries in "
                    f"{time.monotonic() - started:.1f} s); check APPLIANCE_HF_ENDPOINT and "
                    "this machine's network (a proxy?), then add the model again") from None
            time.sleep(CONNECT_PAUSE_S * attempt)
    files = []
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        size = lfs.size if lfs else sibling.size
        if size is None:
            raise StoreError(f"{what}: the hub gave no size for {sibling.rfilename}")
        files.append(RemoteFile(path=sibling.rfilename, size=int(size),
                                sha256=lfs.sha256 if lfs else "",
                                git_sha1="" if lfs else (sibling.blob_id or "")))
    if not info.sha:
        raise StoreError(f"{what}: the hub gave no commit for this revision")
    # Small files first: config.json is there early, so the store can say what it is.
    files.sort(key=lambda f: (f.size, f.path))
    return RepoPlan(repo_id=repo_id, revision=revision, commit=info.sha, files=tuple(files))


def safe_destination(folder: Path, path: str) -> Path:
    """Where a repo file goes: inside the folder, whatever the hub's name says."""
    dest = (folder / path).resolve()
    if not dest.is_relative_to(folder.resolve()) or path.startswith("/"):
        raise StoreError(f"the hub named a file outside the model folder: {path!r}")
    return dest


def bytes_on_disk(folder: Path, file: RemoteFile) -> int:
    """What a file already has here: all of it, a resumable part, or nothing."""
    dest = safe_destination(folder, file.path)
    part = dest.with_name(dest.name + PARTIAL_SUFFIX)
    for candidate in (dest, part):
        try:
            return min(candidate.stat().st_size, file.size)
        except OSError:
            continue
    return 0


def disk_shortfall(*, folder: Path, plan: RepoPlan, free_bytes: int | None = None) -> str | None:
    """None when what is left to download fits on the folder's file system, else why not."""
    left = sum(f.size - bytes_on_disk(folder, f) for f in plan.files)
    probe = folder if folder.exists() else _existing_parent(folder)
    free = shutil.disk_usage(probe).free if free_bytes is None else free_bytes
    if left <= free:
        return None
    return (f"not enough disk space: {plan.repo_id}@{plan.revision} needs {human(left)} "
            f"more and {probe} has {human(free)} free; free space there or add the model to "
            "another root (APPLIANCE_MODEL_ROOTS)")


def human(size: int) -> str:
    """Bytes as a person reads them (decimal units, as disks are sold)."""
    for unit, factor in (("TB", 1000**4), ("GB", GB), ("MB", 1000**2), ("kB", 1000)):
        if size >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size} bytes"


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


class _CountingFile:
    """The file http_get writes into, telling `progress` each chunk's new total."""

    def __init__(self, handle: BinaryIO, done: int, progress: Callable[[int], None]) -> None:
        self._handle, self.done, self._progress = handle, done, progress

    def write(self, data: bytes) -> int:
        written = self._handle.write(data)
        self.done += written
        self._progress(self.done)  # may raise DownloadCancelledError: the bytes are kept
        return written

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def truncate(self, size: int | None = None) -> int:
        # A server that ignored the Range header sends the file again from its start.
        result = self._handle.truncate(size)
        self.done = self._handle.tell()
        return result


def file_download(*, plan: RepoPlan, file: RemoteFile, folder: Path, endpoint: str,
                  token: str | None, progress: Callable[[int], None],
                  chunk_bytes: int = CHUNK_BYTES) -> Path:
    """Bring one file to its full size at folder/<path>, resuming its .incomplete part."""
    from huggingface_hub import constants, hf_hub_url  # noqa: PLC0415 - heavy: only a download job needs the hub client
    from huggingface_hub.file_download import http_get  # noqa: PLC0415 - as above
    from huggingface_hub.utils import (  # noqa: PLC0415 - as above
        build_hf_headers,
        disable_progress_bars,
    )

    disable_progress_bars()  # the store reports progress itself; no tqdm in the worker log
    # http_get reads the body in chunks of this size (10 MiB by default): each is one
    # progress write and one chance to see a cancel, so smaller on a slow link.
    constants.DOWNLOAD_CHUNK_SIZE = chunk_bytes
    dest = safe_destination(folder, file.path)
    if dest.is_file() and dest.stat().st_size == file.size:
        return dest
    part = dest.with_name(dest.name + PARTIAL_SUFFIX)
    part.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(plan.repo_id, file.path, revision=plan.commit, endpoint=endpoint)
    with part.open("ab") as handle:
        if handle.tell() > file.size:  # not this file's bytes: start it again
            handle.truncate(0)
        done = handle.tell()
        progress(done)
        try:
            http_get(url, _CountingFile(handle, done, progress),  # type: ignore[arg-type]
                     resume_size=done, headers=build_hf_headers(token=token or False),
                     expected_size=file.size, displayed_filename=file.path)
        except JobInterruptedError:
            raise  # a stop asked for
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise  # the disk (full, read-only), not the hub: huggingface_hub's own
                # OSErrors (HTTP errors, a short body) carry no errno
            raise _hub_error(exc, f"{plan.repo_id}: {file.path}") from None
    os.replace(part, dest)
    return dest


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest, done = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(done)
    return digest.hexdigest()


def git_blob_sha1_of(path: Path) -> str:
    """A file's git blob id, as the hub lists it for files kept in git (not LFS)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # noqa: S324 (git's id)
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_problem(*, folder: Path, file: RemoteFile, actual_sha256: str) -> str | None:
    """None when the file on disk is the hub's: its size, and its checksum where the hub
    gives one (an LFS file's sha256, a git file's blob id)."""
    dest = safe_destination(folder, file.path)
    try:
        size = dest.stat().st_size
    except OSError:
        return f"{file.path} is missing"
    if size != file.size:
        return f"{file.path} is {size} bytes, the hub's is {file.size}"
    if file.sha256 and actual_sha256 != file.sha256:
        return (f"{file.path}: sha256 {actual_sha256} differs from the hub's {file.sha256} "
                "(corrupted in transfer or on disk)")
    if file.git_sha1 and (actual := git_blob_sha1_of(dest)) != file.git_sha1:
        return (f"{file.path}: git blob id {actual} differs from the hub's {file.git_sha1} "
                "(corrupted in transfer or on disk)")
    return None


class RateMeter:
    """Bytes per second over the last `window_s`, and the time left at that rate."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._window, self._clock = window_s, clock
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, total_done: int) -> None:
        now = self._clock()
        self._samples.append((now, total_done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return max(b1 - b0, 0) / (t1 - t0) if t1 > t0 else 0.0

    @staticmethod
    def seconds_left(*, rate: float, left: int) -> float | None:
        return left / rate if rate > 0 else None


def plan_to_marker(plan: RepoPlan, state: str) -> dict[str, Any]:
    """What the folder's marker file says (appliance.store.scan reads it)."""
    return {"repo_id": plan.repo_id, "revision": plan.revision, "commit": plan.commit,
            "state": state, "files": [{"path": f.path, "size": f.size, "sha256": f.sha256}
                                      for f in plan.files]}
