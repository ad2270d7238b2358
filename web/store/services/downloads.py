"""Adding a model from a Hugging Face hub: the request, the job, cancel, resume.

The request makes the entry (state downloading) and, after commit, a job on the models
queue. The job takes the entry's lease, pins the revision to a commit, refuses before a
byte is written when what is left will not fit, downloads file by file (each resumes its
own .incomplete part), then verifies every file's size and LFS sha256 and only then marks
the entry ready. Progress goes to the rows every STORE_PROGRESS_MS; the same write renews
the lease and reads the cancel flag. A killed worker's lease runs out and the job that
model_downloads_resume queues at the next worker start goes on from the bytes on disk.
"""

from __future__ import annotations

import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from appliance.runtime.secrets import SecretMissingError, resolve_secrets
from appliance.store import hub
from appliance.store.config import config_summary, is_drafter, read_config_file
from appliance.store.scan import PARTIAL_SUFFIX, write_marker
from web import tasks

from ..models import ACTIVE_STATES, FileState, ModelEntry, ModelFile, ModelKind, ModelSource
from ..models import ModelState as S
from .download_progress import DownloadProgress, LeaseLostError, Stopped

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
_FOLDER_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
# An entry in one of these may be asked for again: the new job resumes what is on disk.
_RETRYABLE = frozenset({S.PARTIAL, S.FAILED, S.CANCELLED})


@dataclass
class StoreInputError(Exception):
    """Bad input: field -> what is wrong and how to fix it (a 400, a form error)."""

    errors: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.errors.items())


# ------------------------------------------------------------------ the request

def _below_root(path: str, root: str) -> str:
    """A folder the user wrote as a full path (/models/org/name) as the part below `root`;
    any other path as written (an absolute one outside the root is refused as such)."""
    if path.startswith("/"):
        try:
            return str(PurePosixPath(path).relative_to(root))
        except ValueError:
            return path
    return path


def _folder_error(relative_path: str, root: str | None) -> str | None:
    roots = ", ".join(settings.MODEL_ROOTS)
    if relative_path.startswith("/"):
        return (f"{relative_path} is outside the model roots ({roots}, APPLIANCE_MODEL_ROOTS): "
                "give a folder below the root, like org/name")
    parts = PurePosixPath(relative_path).parts
    if not parts or not all(_FOLDER_PART.fullmatch(p) for p in parts):
        return ("must be a folder below the root, like org/name (letters, digits, . _ -; "
                "no '..', no leading /)")
    if root is None:
        return None
    # A symlink on the way (root/org -> /etc) would put the download outside the root.
    real, top = os.path.realpath(os.path.join(root, relative_path)), os.path.realpath(root)
    if not real.startswith(top.rstrip("/") + "/"):
        return (f"{root}/{relative_path} resolves to {real}, outside the model roots "
                f"({roots}): a symlink leads out of the root; choose another folder")
    return None


def _checked(repo_id: str, revision: str, root: str, relative_path: str) -> dict[str, str]:
    errors: dict[str, str] = {}
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id:
        errors["repo_id"] = "must be a hub repository id like moonshotai/Kimi-K2.6"
    if not _REVISION.fullmatch(revision) or ".." in revision:
        errors["revision"] = "must be a branch, tag or commit of the repository, like main"
    if root not in settings.MODEL_ROOTS:
        errors["root"] = (f"must be one of the model roots: {', '.join(settings.MODEL_ROOTS)} "
                          "(APPLIANCE_MODEL_ROOTS)")
    problem = _folder_error(relative_path, None if "root" in errors else root)
    if problem:
        errors["path"] = problem
    return errors



def model_download_request(*, repo_id: str, revision: str = "main", root: str | None = None,
                           relative_path: str | None = None) -> ModelEntry:
    """A new entry (or a partial, failed or cancelled one again) and its download job."""
    repo_id, revision = repo_id.strip(), (revision or "main").strip()
    root = root or settings.MODEL_ROOTS[0]
    relative_path = _below_root((relative_path or repo_id).strip().rstrip("/"), root)
    errors = _checked(repo_id, revision, root, relative_path)
    if errors:
        raise StoreInputError(errors)
    with transaction.atomic():
        entry = _entry_for_download(repo_id, revision, root, relative_path)
        tasks.model_download_later(entry.pk)
    return entry


def _entry_for_download(repo_id: str, revision: str, root: str, relative_path: str
                        ) -> ModelEntry:
    existing = ModelEntry.objects.select_for_update().filter(
        root=root, relative_path=relative_path).first()
    if existing is None:
        try:
            with transaction.atomic():
                return ModelEntry.objects.create(
                    root=root, relative_path=relative_path, source=ModelSource.HUB,
                    repo_id=repo_id, revision=revision, state=S.DOWNLOADING)
        except IntegrityError:  # a second request for the same folder won the insert
            raise StoreInputError({"path": f"{relative_path} was just added by another "
                                           "request"}) from None
    # Only the same repo and revision again: its whole files are kept and its parts resumed.
    # Another revision's files of the same size would pass for this one's where the hub has
    # no checksum, so it goes in a folder of its own.
    if existing.state not in _RETRYABLE or (existing.repo_id, existing.revision) != (
            repo_id, revision):
        raise StoreInputError({"path": f"{root}/{relative_path} already holds "
                               f"{existing.repo_id or 'a model'}@{existing.revision or '?'} "
                               f"({existing.state}): choose another folder"})
    existing.state, existing.error = S.DOWNLOADING, ""
    existing.cancel_requested, existing.finished_at = False, None
    existing.save()
    return existing


def model_download_cancel(*, entry_id: int) -> ModelEntry:
    """Ask the job to stop; an entry no job holds now is cancelled at once."""
    now = timezone.now()
    ModelEntry.objects.filter(pk=entry_id, state__in=ACTIVE_STATES).update(
        cancel_requested=True)
    free = ModelEntry.objects.filter(pk=entry_id, state__in=ACTIVE_STATES,
                                     cancel_requested=True).exclude(lease_until__gt=now)
    if free.update(state=S.CANCELLED, finished_at=now, rate_bps=0,
                   error="cancelled before a job took it"):
        _remove_partials(ModelEntry.objects.get(pk=entry_id))
    return ModelEntry.objects.get(pk=entry_id)


def model_downloads_resume() -> list[int]:
    """Queue a job for every entry a download was working on (called at worker start): a
    job whose entry is still leased waits for the lease instead of writing beside it."""
    ids = list(ModelEntry.objects.filter(state__in=ACTIVE_STATES, source=ModelSource.HUB)
               .values_list("pk", flat=True))
    for entry_id in ids:
        tasks.model_download_later(entry_id)
    return ids


# ------------------------------------------------------------------ the job

@dataclass(frozen=True)
class JobOutcome:
    """What the task does next: nothing, or run again after `retry_in` seconds."""

    state: str
    retry_in: float | None = None


def _claim(entry_id: int, job_id: str) -> float | None:
    """Take the entry's lease; None when taken, else seconds until the holder's runs out."""
    now = timezone.now()
    until = now + timedelta(seconds=settings.STORE_LEASE_S)
    taken = (ModelEntry.objects.filter(pk=entry_id, state__in=ACTIVE_STATES)
             .exclude(lease_until__gt=now).update(lease_owner=job_id, lease_until=until,
                                                  started_at=now))
    if taken:
        return None
    entry = ModelEntry.objects.filter(pk=entry_id).first()
    if entry is None or entry.state not in ACTIVE_STATES or entry.lease_until is None:
        return -1.0  # nothing to do
    return max((entry.lease_until - now).total_seconds(), 0.0) + 0.5


def _release(entry_id: int, job_id: str, **fields: object) -> None:
    ModelEntry.objects.filter(pk=entry_id, lease_owner=job_id).update(
        lease_owner="", lease_until=None, **fields)


def hf_token() -> str | None:
    """HF_TOKEN from the engine secret store, or None (public repositories need none)."""
    name = settings.STORE_HF_TOKEN_NAME
    try:
        return resolve_secrets([name], directory=settings.ENGINE_SECRETS_DIR)[name]
    except SecretMissingError:
        return None


def model_download_run(*, entry_id: int, job_id: str, attempt: int = 0) -> JobOutcome:
    """The models queue's job: one entry from wherever it stands to ready (or why not)."""
    wait = _claim(entry_id, job_id)
    if wait is not None:
        return JobOutcome("busy" if wait >= 0 else "nothing", wait if wait >= 0 else None)
    entry = ModelEntry.objects.get(pk=entry_id)
    try:
        return _run(entry, job_id)
    except LeaseLostError:
        return JobOutcome("lease-lost")
    except hub.DownloadCancelledError:
        _remove_partials(entry)
        _release(entry_id, job_id, state=S.CANCELLED, finished_at=timezone.now(), rate_bps=0,
                 error="cancelled")
        return JobOutcome(S.CANCELLED)
    except hub.HubNotReachedError as exc:
        if attempt > 0:  # it answered before, then went away: a network fault, tried again
            return _unreachable(entry, job_id, str(exc), attempt)
        # The first request found no hub: said at once, not after STORE_RETRIES waits.
        state = S.PARTIAL if entry.commit else S.FAILED  # bytes on disk are resumed later
        _release(entry_id, job_id, state=state, finished_at=timezone.now(), rate_bps=0,
                 error=str(exc))
        return JobOutcome(state)
    except hub.HubUnreachableError as exc:
        return _unreachable(entry, job_id, str(exc), attempt)
    except hub.StoreError as exc:
        _release(entry_id, job_id, state=S.FAILED, finished_at=timezone.now(), rate_bps=0,
                 error=str(exc))
        return JobOutcome(S.FAILED)
    except OSError as exc:  # the disk, not the hub: a full or read-only root
        _release(entry_id, job_id, state=S.PARTIAL, finished_at=timezone.now(), rate_bps=0,
                 error=f"writing under {entry.root} failed: {exc.strerror or exc}")
        return JobOutcome(S.PARTIAL)


def _unreachable(entry: ModelEntry, job_id: str, message: str, attempt: int) -> JobOutcome:
    if attempt >= settings.STORE_RETRIES:
        _release(entry.pk, job_id, state=S.PARTIAL, finished_at=timezone.now(), rate_bps=0,
                 error=f"{message}; gave up after {attempt} tries: add it again to resume")
        return JobOutcome(S.PARTIAL)
    _release(entry.pk, job_id, rate_bps=0,
             error=f"{message}; trying again in {settings.STORE_RETRY_S} s")
    return JobOutcome("retry", float(settings.STORE_RETRY_S))


def _plan(entry: ModelEntry, token: str | None) -> hub.RepoPlan:
    """The repo's files, pinned: a resumed job keeps the commit the first one found."""
    plan = hub.repo_plan(repo_id=entry.repo_id, revision=entry.commit or entry.revision,
                         endpoint=settings.HF_ENDPOINT, token=token)
    if entry.commit and plan.commit != entry.commit:
        raise hub.StoreError(f"{entry.repo_id}: the hub answered commit {plan.commit} for "
                             f"the pinned {entry.commit}")
    return hub.RepoPlan(repo_id=plan.repo_id, revision=entry.revision, commit=plan.commit,
                        files=plan.files)


def _record_plan(entry: ModelEntry, plan: hub.RepoPlan) -> dict[str, ModelFile]:
    ModelEntry.objects.filter(pk=entry.pk).update(
        commit=plan.commit, size_bytes=plan.total_bytes, file_count=len(plan.files))
    wanted = {f.path: f for f in plan.files}
    ModelFile.objects.filter(entry=entry).exclude(path__in=wanted).delete()
    rows = {row.path: row for row in ModelFile.objects.filter(entry=entry)}
    for path, remote in wanted.items():
        if path not in rows:
            rows[path] = ModelFile.objects.create(entry=entry, path=path,
                                                  size_bytes=remote.size,
                                                  sha256_expected=remote.sha256)
    return rows


def _folder(entry: ModelEntry) -> Path:
    return Path(entry.root) / entry.relative_path


def _run(entry: ModelEntry, job_id: str) -> JobOutcome:
    token = hf_token()
    plan = _plan(entry, token)
    folder = _folder(entry)
    shortfall = hub.disk_shortfall(folder=folder, plan=plan)
    if shortfall:
        raise hub.StoreError(shortfall)
    rows = _record_plan(entry, plan)
    write_marker(folder, hub.plan_to_marker(plan, S.DOWNLOADING))
    ModelEntry.objects.filter(pk=entry.pk).update(state=S.DOWNLOADING, error="")
    meter = DownloadProgress(entry.pk, job_id, rows)

    def fetch(remote: hub.RemoteFile) -> None:
        try:
            if meter.stopped:
                return
            meter.start(remote)
            hub.file_download(plan=plan, file=remote, folder=folder,
                              endpoint=settings.HF_ENDPOINT, token=token,
                              progress=meter.updater(remote.path),
                              chunk_bytes=settings.STORE_CHUNK_BYTES)
            meter.finish(remote)
        finally:
            connection.close()  # this thread's own connection, never the job's

    # A few files at once: one connection to a hub's CDN rarely fills a fast link.
    with ThreadPoolExecutor(max_workers=max(settings.STORE_PARALLEL_FILES, 1),
                            thread_name_prefix=f"model-{entry.pk}") as pool:
        futures = [pool.submit(fetch, remote) for remote in plan.files]
        errors = []
        for future in as_completed(futures):
            error = future.exception()
            if error is not None:
                meter.stop(error)
                errors.append(error)
    if errors:
        raise _first_cause(errors)
    return _verify(entry, job_id, plan, rows, meter)


def _first_cause(errors: list[BaseException]) -> BaseException:
    """What stopped the files: a cancel or a lost lease first (the others followed it),
    then the disk, then the hub."""
    for kind in (hub.JobInterruptedError, OSError, hub.StoreError):
        for error in errors:
            if isinstance(error, kind) and not isinstance(error, Stopped):
                return error
    return errors[0]


def _verify(entry: ModelEntry, job_id: str, plan: hub.RepoPlan, rows: dict[str, ModelFile],
            meter: DownloadProgress) -> JobOutcome:
    ModelEntry.objects.filter(pk=entry.pk).update(state=S.VERIFYING, rate_bps=0)
    folder, problems = _folder(entry), []
    for remote in plan.files:
        row = rows[remote.path]
        ModelFile.objects.filter(pk=row.pk).update(state=FileState.VERIFYING)
        actual = hub.sha256_of(hub.safe_destination(folder, remote.path),
                               progress=meter.heartbeat) if remote.sha256 else ""
        problem = hub.file_problem(folder=folder, file=remote, actual_sha256=actual)
        ModelFile.objects.filter(pk=row.pk).update(
            sha256_actual=actual, state=FileState.FAILED if problem else FileState.READY,
            error=problem or "")
        if problem:
            problems.append(problem)
    return _conclude(entry, job_id, plan, problems)


def _conclude(entry: ModelEntry, job_id: str, plan: hub.RepoPlan, problems: list[str]
              ) -> JobOutcome:
    folder, now = _folder(entry), timezone.now()
    if problems:
        write_marker(folder, hub.plan_to_marker(plan, S.FAILED))
        _release(entry.pk, job_id, state=S.FAILED, finished_at=now,
                 error="verification failed: " + "; ".join(problems)
                 + ". Add the model again to download the failed files anew")
        for remote in plan.files:  # a bad file is removed, so the next try fetches it anew
            if any(p.startswith(remote.path + ":") for p in problems):
                hub.safe_destination(folder, remote.path).unlink(missing_ok=True)
        return JobOutcome(S.FAILED)
    config = read_config_file(folder) or {}
    write_marker(folder, hub.plan_to_marker(plan, S.READY))
    _release(entry.pk, job_id, state=S.READY, finished_at=now, verified_at=now, rate_bps=0,
             error="", config=config_summary(config),
             kind=ModelKind.DRAFTER if is_drafter(config) else ModelKind.TARGET)
    return JobOutcome(S.READY)


def _remove_partials(entry: ModelEntry) -> None:
    """A cancelled download leaves no half file behind (the whole ones stay for a retry)."""
    folder = _folder(entry)
    for row in ModelFile.objects.filter(entry=entry):
        try:
            dest = hub.safe_destination(folder, row.path)
        except hub.StoreError:
            continue
        dest.with_name(dest.name + PARTIAL_SUFFIX).unlink(missing_ok=True)
    ModelFile.objects.filter(entry=entry).exclude(state=FileState.READY).update(
        bytes_done=0, state=FileState.PENDING)
