"""The root scan: the store's rows follow what the roots hold.

A folder found is an entry (made or updated); a local entry whose folder is gone goes; a
hub entry whose folder is gone, or no longer whole, becomes partial. An entry a download
job works on is the job's: the scan leaves it alone.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from appliance.store.scan import ScannedModel, scan_root

from ..models import ACTIVE_STATES, ModelEntry, ModelSource
from ..models import ModelState as S

SCAN_LOCK_CLASS = 0x53434E  # the advisory lock space of root scans ("SCN")


def _state(found: ScannedModel, entry: ModelEntry | None) -> tuple[str, str]:
    """(state, error) of a scanned folder. A hub entry is verified by its download job
    alone: the scan keeps what that left (failed and cancelled stay so), and only turns a
    ready one partial when a file has since gone missing or short. A local folder is ready
    when whole (sizes, index, safetensors headers: appliance.store.scan)."""
    hub = entry is not None and entry.source == ModelSource.HUB
    if hub and entry is not None and entry.state in (S.FAILED, S.CANCELLED, S.PARTIAL):
        return entry.state, entry.error
    if not found.whole:
        return S.PARTIAL, "; ".join(found.problems)
    if hub and entry is not None:
        return entry.state, entry.error
    return S.READY, ""


def _upsert(root: str, found: ScannedModel, entry: ModelEntry | None) -> ModelEntry:
    state, error = _state(found, entry)
    values = {"repo_id": found.repo_id, "revision": found.revision, "commit": found.commit,
              "size_bytes": found.size_bytes, "file_count": found.file_count,
              "kind": found.kind, "config": found.config, "state": state, "error": error}
    if entry is None:
        now = timezone.now()
        return ModelEntry.objects.create(
            root=root, relative_path=found.relative_path, source=ModelSource.LOCAL,
            bytes_done=found.size_bytes, verified_at=now if state == S.READY else None,
            **values)
    if entry.source == ModelSource.HUB:
        values.pop("repo_id"), values.pop("revision"), values.pop("commit")
    # A download job that took the entry since it was read keeps it (the job's, not ours).
    ModelEntry.objects.filter(pk=entry.pk).exclude(state__in=ACTIVE_STATES).update(**values)
    entry.refresh_from_db()
    return entry


def _gone(entry: ModelEntry) -> None:
    if entry.source == ModelSource.LOCAL:
        entry.delete()
    else:
        ModelEntry.objects.filter(pk=entry.pk).update(
            state=S.PARTIAL, error=f"the folder {entry.root}/{entry.relative_path} is gone "
            "or holds no config.json")


def _scan_one_root(root: str) -> list[ModelEntry]:
    found = {m.relative_path: m for m in scan_root(root)}
    entries = {e.relative_path: e for e in ModelEntry.objects.filter(root=root)}
    result = []
    for path, entry in entries.items():
        if entry.state not in ACTIVE_STATES and path not in found:
            _gone(entry)
    for path, scanned in found.items():
        known = entries.get(path)
        if known is not None and known.state in ACTIVE_STATES:
            result.append(known)
            continue
        result.append(_upsert(root, scanned, known))
    return result


def model_store_scan() -> list[ModelEntry]:
    """Every root looked through once; the entries found, by root then folder. Scans of a
    root run one at a time (the worker's at its start, a person's, another process's): two
    at once each found a new folder with no row yet and both made it (a unique violation)."""
    entries: list[ModelEntry] = []
    for root in settings.MODEL_ROOTS:
        with transaction.atomic():
            _root_held(root)
            entries += _scan_one_root(root)
    return entries


def _root_held(root: str) -> None:
    """This transaction holds the root's scan lock (released at its end)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                           [SCAN_LOCK_CLASS, root])
