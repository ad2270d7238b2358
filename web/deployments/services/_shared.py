"""What builds and engines both need, kept apart so neither imports the other for it."""

from __future__ import annotations

from typing import Any


def _runtime() -> Any:
    from appliance.runtime.containers import EngineRuntime

    return EngineRuntime()
