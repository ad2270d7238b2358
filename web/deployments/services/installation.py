"""This install's id: containers carry it, so an agent adopts only this install's engines."""

from __future__ import annotations

import secrets

from ..models import Installation


def instance_id() -> str:
    """This install's id, made once and kept in the database.

    Read each time (one indexed row), not cached: a process must never carry the id of a
    database that has since been reset into a new install.
    """
    row = Installation.objects.order_by("pk").first()
    if row is None:
        row, _ = Installation.objects.get_or_create(
            pk=1, defaults={"instance_id": secrets.token_hex(8)})
    return row.instance_id
