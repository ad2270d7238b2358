"""Appending events to a deployment's log, and publishing them on the live channel."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from .. import live
from ..models import Deployment, Event

COPY_MIN_ROWS = 50  # below this, one INSERT is as quick

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
        now = timezone.now()
        rows = [Event(deployment_id=deployment_id, seq=first + i, kind=kind, payload=payload,
                      ts=now) for i, (kind, payload) in enumerate(items)]
        _insert(rows)
        wire = [row.to_wire() for row in rows]
        transaction.on_commit(lambda: live.publish_later(deployment_id, wire))
    return rows


def _insert(rows: list[Event]) -> None:
    """PostgreSQL's COPY for a batch (the engine agent stores tens of thousands of lines a
    second: INSERT's per-value SQL quoting was most of that time); bulk_create elsewhere."""
    if connection.vendor != "postgresql" or len(rows) < COPY_MIN_ROWS:
        Event.objects.bulk_create(rows)
        return
    columns = "deployment_id, seq, ts, kind, payload"
    with connection.cursor() as cursor, cursor.cursor.copy(
            f"COPY {Event._meta.db_table} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row((row.deployment_id, row.seq, row.ts, row.kind,
                            json.dumps(row.payload, separators=(",", ":"))))
