"""Reads of the model store (web side); writes are in web.store.services."""

from __future__ import annotations

from pathlib import PurePosixPath

from django.conf import settings
from django.db.models import Q, QuerySet

from appliance.preflight import MODELS_MOUNT
from web.deployments.models import ACTIVE_STATUSES, Deployment

from .models import ModelEntry, ModelFile


def model_entry_get(*, entry_id: int) -> ModelEntry:
    """The entry; ModelEntry.DoesNotExist when there is none."""
    return ModelEntry.objects.get(pk=entry_id)


def model_entries_list(*, state: str | None = None) -> QuerySet[ModelEntry]:
    """Every entry in every root (optionally in one state), by folder."""
    entries = ModelEntry.objects.all()
    return entries.filter(state=state) if state else entries


def model_files_list(*, entry_id: int) -> QuerySet[ModelFile]:
    return ModelFile.objects.filter(entry_id=entry_id)


def _relative(engine_path: str) -> str | None:
    """The folder below /models an engine path names (None: not below it, or `..`)."""
    path = PurePosixPath(engine_path.rstrip("/") or "/")
    if ".." in path.parts:
        return None
    try:
        rest = path.relative_to(MODELS_MOUNT)
    except ValueError:
        return None
    return str(rest) if rest.parts else None


def model_entry_for_path(*, engine_path: str) -> ModelEntry | None:
    """The entry an engine path (/models/<folder>) names, or None when the store has none.

    Every root is mounted at /models, so one folder name may be in several roots; the first
    configured root wins, as it does when pre-flight reads the folder (modelfiles.py).
    """
    rest = _relative(engine_path)
    if rest is None:
        return None
    entries = {e.root: e for e in ModelEntry.objects.filter(relative_path=rest)}
    for root in settings.MODEL_ROOTS:
        if root in entries:
            return entries[root]
    return next(iter(entries.values()), None)


def model_entry_deployments(*, entry: ModelEntry, active_only: bool = False
                            ) -> QuerySet[Deployment]:
    """Deployments whose model or drafter is this entry's folder."""
    path = entry.engine_path
    found = Deployment.objects.filter(Q(spec__engine__model_path=path)
                                      | Q(spec__engine__speculative_draft_model_path=path))
    return found.filter(status__in=ACTIVE_STATUSES) if active_only else found
