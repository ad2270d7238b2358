"""What pre-flight may read of a model on this machine, and where.

A spec names a model by the engine's path, under /models (the models folder, which compose
mounts read-only into the engines, and into this process too). This process finds the
same folder under its model roots (APPLIANCE_MODEL_ROOTS, /models by default; a host
install points it at APPLIANCE_MODELS_DIR), as appliance.preflight.folders does for the
command line: nothing else is ever opened.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from appliance.engine.spec import DeploymentSpec
from appliance.preflight import ModelFolder, folders, read_config, read_weights_bytes


def model_local_path(path: str | None) -> str | None:
    """Where this process sees the engine's model folder, or None (not found or not ours)."""
    return folders.model_local_path(path, settings.MODEL_ROOTS)


def model_folder(path: str) -> ModelFolder:
    """What the file system shows of one engine model path."""
    return folders.model_folder(path, settings.MODEL_ROOTS)


def model_folders(spec: DeploymentSpec) -> dict[str, ModelFolder]:
    """run_preflight's model_folders: each model path field the spec sets."""
    return folders.model_folders(spec, settings.MODEL_ROOTS)


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
