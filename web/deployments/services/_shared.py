"""What builds and engines both need, kept apart so neither imports the other for it."""

from __future__ import annotations

from typing import Any


def engine_runtime() -> Any:
    from appliance.runtime.containers import EngineRuntime

    return EngineRuntime()


def instance_id() -> str:
    """This install's id, made once and kept in the database.

    Read each time (one indexed row), not cached: a process must never carry the id of a
    database that has since been reset into a new install.
    """
    import secrets

    from ..models import Installation

    row = Installation.objects.order_by("pk").first()
    if row is None:
        row, _ = Installation.objects.get_or_create(
            pk=1, defaults={"instance_id": secrets.token_hex(8)})
    return row.instance_id
