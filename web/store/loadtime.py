"""The model store as deployments see it: what pre-flight is told of each model, the
expected weight load, each root's read rate, and the wait for a download still running.

A spec names its models by the engine's path (/models/<folder>); the store's entry for
that folder (models.py) says whether it is verified, still downloading, or unusable. A
deployment whose model is downloading stays queued (phase model_download, its progress in
progress["model_download"]) and its deploy task looks again every MODEL_WAIT_POLL_S; it
fails with a diagnosis when the download fails or is cancelled, and builds and starts the
engine once the entry is verified.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.utils import timezone

from appliance.engine.spec import DeploymentSpec, spec_from_dict
from appliance.lifecycle import Process
from appliance.logs.appliance_causes import MODEL_DOWNLOAD_FAILED
from appliance.preflight import StoreModel, config_from_summary
from appliance.preflight.types import UNUSABLE_STATES, WAITING_STATES
from appliance.store.diskrate import ReadRateError, measure_read_rate
from appliance.store.loadtime import describe_load, load_seconds
from web import tasks
from web.deployments.models import Deployment, DeploymentStatus, EventKind, RootReadRate
from web.deployments.services.events import events_append
from web.deployments.services.lifecycle import deployment_mark_failed
from web.deployments.services.modelfiles import model_folder, model_local_path

from .models import ModelEntry
from .selectors import model_entries_list, model_entry_for_path, model_entry_get

S = DeploymentStatus
MODEL_WAIT_POLL_S = 2.0  # how often a waiting deploy looks at its download again
FIELDS = {"engine.model_path": "weights", "engine.speculative_draft_model_path": "draft_weights"}


# ---------------------------------------------------------------- read rates

def root_read_rate_measure(*, root: str) -> RootReadRate:
    """Measure a root's read rate on its own weight files and keep it (one row per root)."""
    rate = measure_read_rate(root)
    row, _ = RootReadRate.objects.update_or_create(root=root, defaults={
        "gbps": rate.gbps, "bytes_read": rate.bytes_read, "seconds": rate.seconds,
        "method": rate.method, "note": rate.note, "measured_at": timezone.now()})
    return row


def root_read_rate_request(*, root: str) -> None:
    """Queue a measurement on the store's queue once the caller's transaction commits."""
    if root not in settings.MODEL_ROOTS:
        raise ValueError(f"{root!r} is not a model root (APPLIANCE_MODEL_ROOTS)")

    tasks.root_read_rate_later(root)


def root_read_rates_list() -> list[dict[str, Any]]:
    """Every configured root with its latest measurement (None fields: not measured)."""
    rows = {r.root: r for r in RootReadRate.objects.filter(root__in=settings.MODEL_ROOTS)}
    listed = []
    for root in settings.MODEL_ROOTS:
        row = rows.get(root)
        listed.append({"root": root, "gbps": row.gbps if row else None,
                       "gb_read": row.bytes_read / 1e9 if row else None,
                       "seconds": row.seconds if row else None,
                       "method": row.method if row else "", "note": row.note if row else "",
                       "measured_at": row.measured_at if row else None})
    return listed


def root_read_rate_for(*, root: str | None) -> RootReadRate | None:
    return RootReadRate.objects.filter(root=root).first() if root else None


def _root_of(local: str | None) -> str | None:
    """The configured root holding a folder this process sees."""
    if local is None:
        return None
    for root in settings.MODEL_ROOTS:
        top = os.path.realpath(root).rstrip("/") + "/"
        if local.startswith(top):
            return root
    return None


# ---------------------------------------------------------------- models by store entry

# A request may name a model by its store entry instead of its path (the form's choice).
ENTRY_FIELDS = {"model_entry": "model_path", "drafter_entry": "speculative_draft_model_path"}


def store_model_options() -> list[dict[str, Any]]:
    """The store's entries as the deployment form offers them, each with its expected load."""
    rates = {r.root: r.gbps for r in RootReadRate.objects.all()}
    options = []
    for entry in model_entries_list():
        rate = rates.get(entry.root)
        options.append({"id": entry.pk, "path": entry.engine_path, "kind": entry.kind,
                        "state": entry.state, "bytes": entry.size_bytes, "read_gbps": rate,
                        "estimate": describe_load(weights_bytes=entry.size_bytes,
                                                  rate_gbps=rate)})
    return options


def _entry_path(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    try:
        return model_entry_get(entry_id=int(value)).engine_path
    except (ValueError, ModelEntry.DoesNotExist):
        return None


def deployment_entries_resolve(*, data: Any) -> tuple[Any, dict[str, list[str]]]:
    """The request with model_entry / drafter_entry turned into the engine's paths, and an
    error per entry id the store does not have."""
    if not isinstance(data, dict) or not any(key in data for key in ENTRY_FIELDS):
        return data, {}
    data, errors = dict(data), {}
    engine = dict(data["engine"]) if isinstance(data.get("engine"), dict) else {}
    for key, path_field in ENTRY_FIELDS.items():
        value = data.pop(key, None)
        if value in (None, ""):
            continue
        path = _entry_path(value)
        if path is None:
            errors[key] = [f"No model store entry {str(value)[:40]!r}: use the id of an entry "
                           "the store lists (the store page), or give the path instead."]
        else:
            engine[path_field] = path
    data["engine"] = engine
    return data, errors


# ---------------------------------------------------------------- store facts

def _entry(path: str) -> ModelEntry | None:
    return model_entry_for_path(engine_path=path)


def _store_model(path: str) -> StoreModel | None:
    """What the store says of one engine path; None when it is neither an entry nor in a root."""
    entry = _entry(path)
    if entry is not None:
        rate = root_read_rate_for(root=entry.root)
        return StoreModel(path=path, entry_id=entry.pk, state=entry.state,
                          size_bytes=entry.size_bytes, bytes_done=entry.bytes_done,
                          error=entry.error, read_gbps=rate.gbps if rate else None)
    root = _root_of(model_local_path(path))
    if root is None:
        return None  # not on this machine at all: the file rules say so
    rate = root_read_rate_for(root=root)
    return StoreModel(path=path, read_gbps=rate.gbps if rate else None)


def _paths(spec: DeploymentSpec) -> dict[str, str]:
    e = spec.engine
    values = {"engine.model_path": e.model_path,
              "engine.speculative_draft_model_path": e.speculative_draft_model_path}
    return {fld: path for fld, path in values.items() if path}


def store_models(spec: DeploymentSpec) -> dict[str, StoreModel]:
    """run_preflight's store_models: each model path field the store or a root knows."""
    found = {fld: _store_model(path) for fld, path in _paths(spec).items()}
    return {fld: model for fld, model in found.items() if model is not None}


def store_facts(spec: DeploymentSpec, facts: dict[str, Any]) -> dict[str, Any]:
    """The local model facts, with the store's config summary where no config.json is
    on disk yet (a download still running) and its sizes where no weights are."""
    facts = dict(facts)
    for fld, config_key, bytes_key in (
            ("engine.model_path", "model_config", "weights_bytes"),
            ("engine.speculative_draft_model_path", "drafter_config", "drafter_weights_bytes")):
        path = _paths(spec).get(fld)
        entry = _entry(path) if path else None
        if entry is None:
            continue
        if facts.get(config_key) is None:
            facts[config_key] = config_from_summary(entry.config)
        # Mid-download the folder holds part of the shards: the store knows the whole size.
        downloading = entry.state in WAITING_STATES
        if entry.size_bytes and (downloading or not facts.get(bytes_key)):
            facts[bytes_key] = entry.size_bytes
    return {**facts, "store_models": store_models(spec)}


def load_estimate(spec: DeploymentSpec) -> dict[str, Any]:
    """Deployment.load_estimate: per model, its bytes, its root's read rate and seconds."""
    estimate: dict[str, Any] = {}
    for fld, model in store_models(spec).items():
        size = model.size_bytes or _bytes_on_disk(model.path)
        if not size:
            continue
        estimate[FIELDS[fld]] = {
            "path": model.path, "bytes": size, "read_gbps": model.read_gbps,
            "expected_s": load_seconds(weights_bytes=size, rate_gbps=model.read_gbps or 0)}
    return estimate


def _bytes_on_disk(path: str) -> int:
    return model_folder(path).weights_bytes


def unmeasured_roots(spec: DeploymentSpec) -> list[str]:
    """The roots of this spec's models that have no read rate yet."""
    roots = []
    for path in _paths(spec).values():
        entry = _entry(path)
        root = entry.root if entry is not None else _root_of(model_local_path(path))
        if root in settings.MODEL_ROOTS and root_read_rate_for(root=root) is None:
            roots.append(root)
    return sorted(set(roots))


# ---------------------------------------------------------------- waiting for a download

def _download(entry: ModelEntry) -> dict[str, Any]:
    return {"path": entry.engine_path, "entry_id": entry.pk, "state": entry.state,
            "bytes_done": entry.bytes_done, "size_bytes": entry.size_bytes,
            "rate_bps": entry.rate_bps}


def _fail(deployment_id: int, entry: ModelEntry) -> str:
    why = f": {entry.error}" if entry.error else ""
    diagnosis = MODEL_DOWNLOAD_FAILED.worded(
        summary=f"The model {entry.engine_path} is {entry.state} in the model store{why}; a "
        "partial or failed model is never mounted into an engine.",
        evidence={"entry_id": entry.pk, "state": entry.state})
    deployment_mark_failed(deployment_id=deployment_id, diagnosis=diagnosis,
                           last_lines=[], message=diagnosis.summary, by=Process.BUILDER)
    return S.FAILED


def _note_wait(deployment: Deployment, download: dict[str, Any]) -> None:
    """Progress for the page; an event when the state or the whole percent moved."""
    before = (deployment.progress or {}).get("model_download") or {}
    Deployment.objects.filter(pk=deployment.pk, status=S.QUEUED).update(
        phase="model_download", updated_at=timezone.now(),
        progress={**(deployment.progress or {}), "model_download": download})
    if (before.get("state"), _percent(before)) != (download["state"], _percent(download)):
        events_append(deployment_id=deployment.pk, events=[
            (EventKind.PROGRESS, {"kind": "model_download", **download})])


def _percent(download: dict[str, Any]) -> int | None:
    size = download.get("size_bytes") or 0
    return int(100 * download.get("bytes_done", 0) / size) if size else None


def deployment_model_wait(*, deployment_id: int) -> str:
    """Whether a queued deployment's models are verified: "ready" (go on), "waiting" (its
    deploy task comes back later) or "failed" (a download failed or was cancelled)."""
    deployment = Deployment.objects.get(pk=deployment_id)
    waiting: list[ModelEntry] = []
    for path in _paths(spec_from_dict(deployment.spec)).values():
        entry = _entry(path)
        if entry is None:
            continue  # a local folder, as before the store
        if entry.state in UNUSABLE_STATES:
            return _fail(deployment_id, entry)
        if entry.state in WAITING_STATES:
            waiting.append(entry)
    if waiting:
        _note_wait(deployment, _download(waiting[0]))
        return "waiting"
    if (deployment.progress or {}).get("model_download"):
        _note_ready(deployment)
    return "ready"


def _note_ready(deployment: Deployment) -> None:
    download = {**deployment.progress["model_download"], "state": "ready"}
    Deployment.objects.filter(pk=deployment.pk).update(
        load_estimate=load_estimate(spec_from_dict(deployment.spec)),
        progress={**deployment.progress, "model_download": download})
    events_append(deployment_id=deployment.pk, events=[
        (EventKind.PROGRESS, {"kind": "model_download", **download})])


def deployment_models_refused(*, deployment: Deployment) -> list[str]:
    """This deployment's models the store has not verified, as "<path> (<state>)"; empty:
    all may be mounted. Folders the store has no entry for are local models, as before."""
    refused = []
    for path in _paths(spec_from_dict(deployment.spec)).values():
        entry = _entry(path)
        if entry is not None and not entry.is_usable:
            refused.append(f"{path} ({entry.state})")
    return refused


__all__ = ["ENTRY_FIELDS", "MODEL_WAIT_POLL_S", "ReadRateError", "deployment_entries_resolve",
           "deployment_model_wait", "store_model_options",
           "deployment_models_refused", "load_estimate",
           "root_read_rate_for", "root_read_rate_measure", "root_read_rates_list",
           "root_read_rate_request", "store_facts", "store_models", "unmeasured_roots"]
