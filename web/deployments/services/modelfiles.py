"""What pre-flight may read of a model on this machine, and where.

A spec names a model by the engine's path, under /models (the models folder, which compose
mounts read-only into the engines, and into this process too). This process finds the
same folder under its model roots (APPLIANCE_MODEL_ROOTS, /models by default; a host
install points it at APPLIANCE_MODELS_DIR): /models/<rest> is <root>/<rest>, for a <rest>
with no `..` whose real location (symlinks followed) stays in the root. Nothing else is
ever opened. What it finds goes to pre-flight as plain data (appliance.preflight.files).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from appliance.engine.spec import DeploymentSpec
from appliance.preflight import (
    MODELS_MOUNT,
    WEIGHT_SUFFIXES,
    ModelFolder,
    read_config,
    read_weights_bytes,
)

MAX_SIBLINGS = 200  # folder names offered for a typo; a huge models folder is not listed


def _relative(path: str | None) -> PurePosixPath | None:
    """The part of an engine path below /models, or None when it is not below it."""
    if not path or ".." in PurePosixPath(path).parts:
        return None
    try:
        rest = PurePosixPath(path).relative_to(MODELS_MOUNT)
    except ValueError:
        return None
    return rest if rest.parts else None


def _inside(real: str, root: str) -> bool:
    top = os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def model_local_path(path: str | None) -> str | None:
    """Where this process sees the engine's model folder, or None (not found or not ours)."""
    rest = _relative(path)
    if rest is None:
        return None
    for root in settings.MODEL_ROOTS:
        candidate = os.path.join(root, str(rest))
        real = os.path.realpath(candidate)
        if _inside(real, root) and os.path.isdir(real):
            return real
    return None


def _escapes(rest: PurePosixPath) -> bool:
    """Whether the path is there under a root but resolves out of it (a symlink)."""
    for root in settings.MODEL_ROOTS:
        candidate = os.path.join(root, str(rest))
        if os.path.lexists(candidate) and not _inside(os.path.realpath(candidate), root):
            return True
    return False


def _siblings(rest: PurePosixPath) -> tuple[str, ...]:
    names: set[str] = set()
    for root in settings.MODEL_ROOTS:
        parent = Path(root, *rest.parts[:-1])
        try:
            names.update(p.name for p, _ in zip(parent.iterdir(), range(MAX_SIBLINGS),
                                                strict=False) if p.is_dir())
        except OSError:
            continue  # no such root here
    return tuple(sorted(names))


def _weights(folder: Path) -> tuple[int, int]:
    """Weight files directly in the folder (HF checkpoints keep them flat) and their bytes."""
    count = size = 0
    for entry in folder.iterdir():
        if entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
            count, size = count + 1, size + entry.stat().st_size
    return count, size


def model_folder(path: str) -> ModelFolder:
    """What the file system shows of one engine model path."""
    rest = _relative(path)
    if rest is None:
        return ModelFolder(path=path, mounted=False, exists=False)
    local = model_local_path(path)
    if local is None:
        return ModelFolder(path=path, mounted=True, exists=False, siblings=_siblings(rest),
                           escapes=_escapes(rest))
    folder = Path(local)
    try:
        count, size = _weights(folder)
        has_config = (folder / "config.json").is_file()
    except OSError:
        count, size, has_config = 0, 0, False  # unreadable: reported as missing files
    return ModelFolder(path=path, mounted=True, exists=True, has_config=has_config,
                       weight_files=count, weights_bytes=size)


def model_folders(spec: DeploymentSpec) -> dict[str, ModelFolder]:
    """run_preflight's model_folders: each model path field the spec sets."""
    paths = {"engine.model_path": spec.engine.model_path,
             "engine.speculative_draft_model_path": spec.engine.speculative_draft_model_path}
    return {fld: model_folder(path) for fld, path in paths.items() if path}


def _weights_bytes(path: str | None) -> int | None:
    try:
        return read_weights_bytes(path)
    except OSError:
        return None  # a name too long, a folder it may not list: no fact, no error


def local_model_facts(spec: DeploymentSpec) -> dict[str, Any]:
    """run_preflight's model arguments, from the files it may read (None where not)."""
    target = model_local_path(spec.engine.model_path)
    drafter = model_local_path(spec.engine.speculative_draft_model_path)
    return {"model_config": read_config(target), "drafter_config": read_config(drafter),
            "weights_bytes": _weights_bytes(target),
            "drafter_weights_bytes": _weights_bytes(drafter),
            "model_folders": model_folders(spec)}
