"""What builds and engines both need, kept apart so neither imports the other for it."""

from __future__ import annotations

from typing import Any


def _runtime() -> Any:
    from appliance.runtime.containers import EngineRuntime

    return EngineRuntime()


_INSTANCE_ID: str | None = None


def instance_id() -> str:
    """This install's id, made once and kept in the database (cached per process)."""
    global _INSTANCE_ID
    if _INSTANCE_ID is None:
        import secrets

        from ..models import Installation

        row = Installation.objects.order_by("pk").first()
        if row is None:
            row, _ = Installation.objects.get_or_create(pk=1, defaults={
                "instance_id": secrets.token_hex(8)})
        _INSTANCE_ID = row.instance_id
    return _INSTANCE_ID
