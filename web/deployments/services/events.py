"""Appending events to a deployment's log, and publishing them on the live channel."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F

from .. import live
from ..models import Deployment, Event

# -------------------------------------------------------------------- events


def events_append(
    *, deployment_id: int, events: Iterable[tuple[str, dict[str, Any]]]
) -> list[Event]:
    """Append events with gap-free seq numbers; publish them live after commit."""
    items = list(events)
    if not items:
        return []
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment_id).update(last_seq=F("last_seq") + len(items))
        last = Deployment.objects.values_list("last_seq", flat=True).get(pk=deployment_id)
        first = last - len(items) + 1
        rows = Event.objects.bulk_create(
            Event(deployment_id=deployment_id, seq=first + i, kind=kind, payload=payload)
            for i, (kind, payload) in enumerate(items)
        )
        wire = [row.to_wire() for row in rows]
        transaction.on_commit(lambda: live.publish(deployment_id, wire))
    return rows
