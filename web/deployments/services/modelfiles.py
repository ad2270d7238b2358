"""What pre-flight may read of a model on this machine, and where.

The web process reads a checkpoint's config.json and weight sizes only under the model
roots (APPLIANCE_MODEL_ROOTS, /models by default: the read-only mount the engines see too),
for a path with no `..` whose real location (symlinks followed) stays there. Any other path
is not opened: the rules that need the model's facts then stay quiet.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings

from appliance.engine.spec import DeploymentSpec
from appliance.preflight import read_config, read_weights_bytes


def model_path_readable(path: str | None) -> bool:
    if not path or not path.startswith("/") or ".." in PurePosixPath(path).parts:
        return False
    real = os.path.realpath(path)
    for root in settings.MODEL_ROOTS:
        top = os.path.realpath(root)
        if real == top or real.startswith(top.rstrip("/") + "/"):
            return True
    return False


def _weights(path: str | None) -> int | None:
    try:
        return read_weights_bytes(path)
    except OSError:
        return None  # a name too long, a folder it may not list: no fact, no error


def local_model_facts(spec: DeploymentSpec) -> dict[str, Any]:
    """run_preflight's model arguments, from the files it may read (None where not)."""
    target, drafter = spec.engine.model_path, spec.engine.speculative_draft_model_path
    target = target if model_path_readable(target) else None
    drafter = drafter if model_path_readable(drafter) else None
    return {"model_config": read_config(target), "drafter_config": read_config(drafter),
            "weights_bytes": _weights(target), "drafter_weights_bytes": _weights(drafter)}
