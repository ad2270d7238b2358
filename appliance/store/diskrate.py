"""A model root's sequential read rate: a short, bounded read of its real weight files.

The engine's weight load is a sequential read of the safetensors shards, so the figure
that predicts it is what the root's disk delivers for exactly that: large reads from the
start of the biggest weight files, a few in flight at once (SGLang loads shards from
several threads). The page cache would make a second measurement read RAM, so it is
bypassed: O_DIRECT with page-aligned buffers where the filesystem allows it, else
posix_fadvise(DONTNEED) on each file before its read (clean cached pages are dropped;
pages another process holds mapped stay, so the result says which method it used).

Plain Python, no Django: the CLI (`appliance store read-rate`) and the real-engine rig
call it on a GPU host directly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import mmap
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
DEFAULT_MAX_BYTES = 2 * 1024**3  # enough to pass any disk cache, short on a fast array
DEFAULT_MAX_SECONDS = 10.0
DEFAULT_BLOCK = 16 * 1024**2  # a multiple of every logical block size O_DIRECT asks for
DEFAULT_THREADS = 4
FEW_BYTES = 64 * 1024**2  # below this a measurement says it is not a disk's rate
MAX_FILES = 64  # the largest few are plenty; a 2,000-shard root is not listed whole

O_DIRECT = "o_direct"
FADVISE = "fadvise_dontneed"
MEMORY = "memory"  # the files live in RAM (tmpfs): no cache to bypass, no disk to measure
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


class ReadRateError(Exception):
    """Nothing to measure (no weight files) or the files cannot be read."""


@dataclass(frozen=True)
class ReadRate:
    """One measurement: bytes read, how long, and how the page cache was kept out."""

    path: str
    bytes_read: int
    seconds: float
    method: str  # O_DIRECT, FADVISE or MEMORY
    threads: int
    files: tuple[str, ...]
    note: str = ""
    # The share of the weight files in the page cache before the read (None: not known):
    # what an engine loading them now would read from RAM instead of the disk.
    cached_before: float | None = None

    @property
    def gbps(self) -> float:
        """Decimal GB per second (the unit disks are sold in and the log's sizes use)."""
        return self.bytes_read / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "files": list(self.files),
                "gbps": round(self.gbps, 3)}


def weight_files(path: str | os.PathLike[str]) -> list[Path]:
    """The weight files to read, largest first: the file itself, or those under a folder."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ReadRateError(f"{root}: no such file or folder")
    found = [p for p in root.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file()]
    if not found:
        raise ReadRateError(f"{root}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) to read")
    return sorted(found, key=lambda p: p.stat().st_size, reverse=True)[:MAX_FILES]


def _chunks(files: list[Path], block: int) -> Iterator[tuple[Path, int]]:
    for file in files:
        size = file.stat().st_size
        for offset in range(0, size, block):
            yield file, offset


def _direct_works(file: Path, block: int) -> bool:
    """O_DIRECT opens and reads here (tmpfs and some overlay setups refuse it)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        fd = os.open(file, os.O_RDONLY | flag)
    except OSError:
        return False
    try:
        with mmap.mmap(-1, block) as buf:
            os.preadv(fd, [buf], 0)
        return True
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        os.close(fd)


def filesystem_type(path: str | os.PathLike[str]) -> str:
    """The type of the filesystem holding path (the longest mount point above it)."""
    real, best, kind = os.path.realpath(path), "", ""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def _resident(file: Path, limit: int) -> tuple[int, int]:
    """(pages of the file's first `limit` bytes in the page cache, pages looked at): mincore
    over a private mapping that is never touched, so nothing is read from the disk."""

    size = min(file.stat().st_size, limit)
    if size == 0:
        return 0, 0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with file.open("rb") as handle, \
            mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) as mapping:
        # ACCESS_COPY is writable for ctypes (from_buffer) yet never writes the file.
        anchor = ctypes.c_char.from_buffer(mapping)
        try:
            failed = _libc().mincore(ctypes.addressof(anchor), size, vec)
        finally:
            del anchor  # the mapping cannot close while ctypes holds it
    if failed:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(file))
    return sum(b & 1 for b in vec), pages


def page_cache_share(path: str | os.PathLike[str], *,
                     max_bytes: int = 64 * 1024**3) -> float | None:
    """The share of the weight files under path (their first max_bytes) that is in the page
    cache now: near 1.0 means an engine loading them reads RAM, not the disk. None where
    mincore is not available."""
    cached = total = 0
    budget = max_bytes
    try:
        for file in weight_files(path):
            if budget <= 0:
                break
            hit, seen = _resident(file, budget)
            cached, total, budget = cached + hit, total + seen, budget - seen * mmap.PAGESIZE
    except (OSError, AttributeError, ValueError):
        return None
    return cached / total if total else None


def _drop_cache(files: list[Path]) -> None:
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class _Reader:
    """Hands out (file, offset) chunks to the threads until the byte or time budget ends."""

    def __init__(self, files: list[Path], *, block: int, max_bytes: int,
                 deadline: float, direct: bool) -> None:
        self.chunks = _chunks(files, block)
        self.block, self.max_bytes, self.deadline = block, max_bytes, deadline
        self.flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0)
        self.lock = threading.Lock()
        self.claimed = 0
        self.read = 0
        self.used: set[str] = set()

    def _claim(self) -> tuple[Path, int] | None:
        with self.lock:
            if self.claimed >= self.max_bytes or time.monotonic() >= self.deadline:
                return None
            chunk = next(self.chunks, None)
            if chunk is not None:
                self.claimed += self.block
            return chunk

    def run(self) -> None:
        fds: dict[Path, int] = {}
        try:
            with mmap.mmap(-1, self.block) as buf:  # page-aligned, as O_DIRECT needs
                while (chunk := self._claim()) is not None:
                    file, offset = chunk
                    if file not in fds:
                        fds[file] = os.open(file, self.flags)
                    got = os.preadv(fds[file], [buf], offset)
                    with self.lock:
                        self.read += got
                        self.used.add(str(file))
        finally:
            for fd in fds.values():
                os.close(fd)


def _bypass(files: list[Path], block: int, direct: bool | None) -> tuple[str, str]:
    """How the cache is kept out of this read (method, note); drops it when it must."""
    kind = filesystem_type(files[0])
    if kind in MEMORY_FILESYSTEMS:
        return MEMORY, (f"the files are on {kind}, in RAM: this is memory's rate, not a "
                        "disk's; measure the root where the weights really are")
    if direct is not False and _direct_works(files[0], block):
        return O_DIRECT, ""
    _drop_cache(files)
    why = "O_DIRECT was not asked for" if direct is False else \
        f"this filesystem ({kind or 'unknown'}) refuses O_DIRECT"
    return FADVISE, (f"{why}: cached pages were dropped with posix_fadvise(DONTNEED) first; "
                     "pages another process keeps mapped stay cached, so the figure can be high")


def measure_read_rate(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES,
                      max_seconds: float = DEFAULT_MAX_SECONDS, block: int = DEFAULT_BLOCK,
                      threads: int = DEFAULT_THREADS, direct: bool | None = None) -> ReadRate:
    """Read up to max_bytes (or max_seconds) of the weight files under path, cache bypassed.

    direct=None uses O_DIRECT where the filesystem allows it; False always drops the cache
    with posix_fadvise instead (for a filesystem whose O_DIRECT is slow or broken).
    """
    if block <= 0 or block % mmap.PAGESIZE:
        raise ReadRateError(f"block {block} must be a positive multiple of {mmap.PAGESIZE}")
    files = weight_files(path)
    cached = page_cache_share(path)
    try:
        method, note = _bypass(files, block, direct)
        start = time.monotonic()
        reader = _Reader(files, block=block, max_bytes=max_bytes,
                         deadline=start + max_seconds, direct=method == O_DIRECT)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for future in [pool.submit(reader.run) for _ in range(max(1, threads))]:
                future.result()
        seconds = time.monotonic() - start
    except OSError as exc:
        raise ReadRateError(f"{exc.filename or path}: {exc.strerror}") from None
    if reader.read < FEW_BYTES:
        note = " ".join(filter(None, [note, f"only {reader.read / 1e6:.1f} MB of weights to "
                                      "read: the figure is mostly per-read overhead, not the "
                                      "disk's rate"]))
    return ReadRate(path=str(path), bytes_read=reader.read, seconds=seconds,
                    method=method, threads=max(1, threads),
                    files=tuple(sorted(reader.used)), note=note,
                    cached_before=round(cached, 3) if cached is not None else None)
