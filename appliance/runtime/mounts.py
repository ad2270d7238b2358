"""The model folders an engine container mounts: exactly the /models paths its arguments
name, read-only. Framework-free: every host's agent mounts alike."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from appliance.preflight import MODELS_MOUNT


def engine_model_mounts(*, argv: list[str], models_dir: str) -> dict[str, dict[str, str]]:
    """Read-only binds of exactly the /models paths the engine's arguments name, so no
    other folder of the models dir (a partial download among them) is in the engine."""
    mounts: dict[str, dict[str, str]] = {}
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        rest = _below_models(value)
        if rest:
            mounts[os.path.join(models_dir, rest)] = {"bind": f"{MODELS_MOUNT}/{rest}",
                                                      "mode": "ro"}
    return mounts


def _below_models(value: str) -> str | None:
    path = PurePosixPath(value)
    if not value.startswith(MODELS_MOUNT + "/") or ".." in path.parts:
        return None
    rest = str(path.relative_to(MODELS_MOUNT))
    return rest if rest not in ("", ".") else None
