"""What pre-flight may read of a model on this machine, and where: the engine's path under
/models found under the model roots this process is given (the panel's APPLIANCE_MODEL_ROOTS,
the command line's --models-dir or APPLIANCE_MODELS_DIR).

/models/<rest> is <root>/<rest>, for a <rest> with no `..` whose real location (symlinks
followed) stays in the root. Nothing else is ever opened. What it finds goes to pre-flight as
plain data (appliance.preflight.files.ModelFolder).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from appliance.engine.spec import DeploymentSpec
from appliance.preflight.files import MODELS_MOUNT, WEIGHT_SUFFIXES, ModelFolder

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


def model_local_path(path: str | None, roots: Sequence[str]) -> str | None:
    """Where this process sees the engine's model folder, or None (not found or not ours)."""
    rest = _relative(path)
    if rest is None:
        return None
    for root in roots:
        candidate = os.path.join(root, str(rest))
        real = os.path.realpath(candidate)
        if _inside(real, root) and os.path.isdir(real):
            return real
    return None


def _escapes(rest: PurePosixPath, roots: Sequence[str]) -> bool:
    """Whether the path is there under a root but resolves out of it (a symlink)."""
    for root in roots:
        candidate = os.path.join(root, str(rest))
        if os.path.lexists(candidate) and not _inside(os.path.realpath(candidate), root):
            return True
    return False


def _siblings(rest: PurePosixPath, roots: Sequence[str]) -> tuple[str, ...]:
    names: set[str] = set()
    for root in roots:
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


def model_folder(path: str, roots: Sequence[str]) -> ModelFolder:
    """What the file system shows of one engine model path."""
    rest = _relative(path)
    if rest is None:
        return ModelFolder(path=path, mounted=False, exists=False)
    local = model_local_path(path, roots)
    if local is None:
        return ModelFolder(path=path, mounted=True, exists=False, siblings=_siblings(rest, roots),
                           escapes=_escapes(rest, roots))
    folder = Path(local)
    try:
        count, size = _weights(folder)
        has_config = (folder / "config.json").is_file()
    except OSError:
        count, size, has_config = 0, 0, False  # unreadable: reported as missing files
    return ModelFolder(path=path, mounted=True, exists=True, has_config=has_config,
                       weight_files=count, weights_bytes=size)


def model_folders(spec: DeploymentSpec, roots: Sequence[str]) -> dict[str, ModelFolder]:
    """run_preflight's model_folders: each model path field the spec sets."""
    paths = {"engine.model_path": spec.engine.model_path,
             "engine.speculative_draft_model_path": spec.engine.speculative_draft_model_path}
    return {fld: model_folder(path, roots) for fld, path in paths.items() if path}
