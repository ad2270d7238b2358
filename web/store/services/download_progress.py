"""A download job's progress (web/store/services/downloads.py): its files, several at once,
each on its own thread, written to the rows at most every STORE_PROGRESS_MS; each write
renews the entry's lease and reads its cancel flag."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from appliance.store import hub

from ..models import FileState, ModelEntry, ModelFile


class LeaseLostError(hub.JobInterruptedError):
    """Another job holds the entry now; this one stops writing at once."""


class Stopped(hub.JobInterruptedError):
    """Another file of the same job stopped it; this one ends without a word of its own."""


class DownloadProgress:
    """Progress of one job's files (several at once, each on its own thread), written at
    most every STORE_PROGRESS_MS; each write renews the lease (LeaseLostError when another
    job took it) and reads the cancel flag. The rate counts what this job fetched, not the
    bytes a resumed file already had."""

    def __init__(self, entry_id: int, job_id: str, rows: dict[str, ModelFile]) -> None:
        self._entry_id, self._job, self._rows = entry_id, job_id, rows
        self._meter = hub.RateMeter()
        self._every = settings.STORE_PROGRESS_MS / 1000
        self._lock, self._write_lock = threading.Lock(), threading.Lock()
        self._last = 0.0
        self._done: dict[str, int] = {}  # bytes on disk per file started or finished
        self._base: dict[str, int] = {}  # what each file had when this job began it
        self._written: dict[str, int] = {}
        self._stop: BaseException | None = None

    @property
    def stopped(self) -> bool:
        return self._stop is not None

    def stop(self, error: BaseException) -> None:
        with self._lock:
            self._stop = self._stop or error

    def start(self, remote: hub.RemoteFile) -> None:
        ModelFile.objects.filter(pk=self._rows[remote.path].pk).update(
            state=FileState.DOWNLOADING)

    def updater(self, path: str) -> Callable[[int], None]:
        return lambda done: self._update(path, done)

    def finish(self, remote: hub.RemoteFile) -> None:
        with self._lock:
            self._base.setdefault(remote.path, remote.size)  # whole before: not fetched now
            self._done[remote.path] = remote.size
        ModelFile.objects.filter(pk=self._rows[remote.path].pk).update(
            bytes_done=remote.size, state=FileState.VERIFYING)  # whole: checked at the end
        self._written[remote.path] = remote.size
        self._flush()

    def heartbeat(self, _: int) -> None:
        """While hashing: keep the lease, see a cancel."""
        if time.monotonic() - self._last >= self._every:
            self._last = time.monotonic()
            self._renew({})

    def _update(self, path: str, done: int) -> None:
        if self._stop is not None:
            raise Stopped(self._entry_id)
        with self._lock:
            self._base.setdefault(path, done)
            self._done[path] = done
            now = time.monotonic()
            due = now - self._last >= self._every
            if due:
                self._last = now
        if due:
            self._flush()

    def _flush(self) -> None:
        with self._write_lock:
            with self._lock:
                done, base = dict(self._done), dict(self._base)
            for path, size in done.items():
                if self._written.get(path) != size:
                    ModelFile.objects.filter(pk=self._rows[path].pk).update(bytes_done=size)
                    self._written[path] = size
            self._meter.add(sum(done[p] - base.get(p, done[p]) for p in done))
            self._renew({"bytes_done": sum(done.values()), "rate_bps": self._meter.rate()})

    def _renew(self, fields: dict[str, object]) -> None:
        until = timezone.now() + timedelta(seconds=settings.STORE_LEASE_S)
        if not ModelEntry.objects.filter(pk=self._entry_id, lease_owner=self._job).update(
                lease_until=until, **fields):
            raise LeaseLostError(self._entry_id)
        if ModelEntry.objects.filter(pk=self._entry_id, cancel_requested=True).exists():
            raise hub.DownloadCancelledError(self._entry_id)
