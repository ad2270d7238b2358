"""Appending events to a deployment's log, and publishing them on the live channel.

The engine agent stores tens of thousands of events a second (issue 22). Its profile
showed most of that time in building Event model instances (Django's pre_init/post_init
signals alone 9 %), encoding each payload twice (COPY, then the live publisher) and a
second query to read the claimed seq back. So a batch is claimed with one
`UPDATE ... RETURNING`, each payload is JSON-encoded once, and that one text is both the
COPY row and the live entry's `data` (the SSE frame's JSON, byte for byte what
`live.wire_json(row.to_wire())` would make).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from .. import live
from ..models import Deployment, Event

COPY_MIN_ROWS = 50  # below this, one INSERT is as quick (events_append)
# One encoder for every payload: json.dumps with separators builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":")).encode

Items = list[tuple[str, dict[str, Any]]]

# -------------------------------------------------------------------- events


def events_append(
    *, deployment_id: int, events: Iterable[tuple[str, dict[str, Any]]]
) -> list[Event]:
    """Append events with gap-free seq numbers; publish them live after commit."""
    items = list(events)
    if not items:
        return []
    with transaction.atomic():
        first, now = _store(deployment_id, items)
    return [Event(deployment_id=deployment_id, seq=first + i, kind=kind, payload=payload,
                  ts=now) for i, (kind, payload) in enumerate(items)]


def events_append_batch(*, deployment_id: int, events: Items) -> int:
    """events_append for the engine agent's batches: the same rows and live entries, with
    no model instances made for the caller; returns the last seq (0 for no events).
    Joins the caller's transaction, so a batch and the log cursor commit together."""
    if not events:
        return 0
    with transaction.atomic(savepoint=False):  # inside the sink's: no savepoint round trips
        # COPY at any size: for the agent's small batches (a quiet engine, a line or ten)
        # building model instances and quoting each value for an INSERT cost more CPU.
        first, _ = _store(deployment_id, events, copy_min_rows=1)
    return first + len(events) - 1


def _store(deployment_id: int, items: Items,
           copy_min_rows: int = COPY_MIN_ROWS) -> tuple[int, datetime]:
    """Claim seqs, write the rows, and publish them once the transaction commits."""
    first = _claim_seqs(deployment_id, len(items))
    now = timezone.now()
    stamp = now.isoformat()
    encoded = [_encode(payload) for _, payload in items]
    if connection.vendor == "postgresql" and len(items) >= copy_min_rows:
        _copy(deployment_id, first, stamp, items, encoded)
    else:
        Event.objects.bulk_create([
            Event(deployment_id=deployment_id, seq=first + i, kind=kind, payload=payload, ts=now)
            for i, (kind, payload) in enumerate(items)])
    entries = [(first + i, kind, _wire(first + i, stamp, kind, text))
               for i, ((kind, _), text) in enumerate(zip(items, encoded, strict=True))]
    transaction.on_commit(lambda: live.publish_entries_later(deployment_id, entries))
    return first, now


def _claim_seqs(deployment_id: int, count: int) -> int:
    """Take `count` seqs in one statement; the row lock it takes orders concurrent writers."""
    table = connection.ops.quote_name(Deployment._meta.db_table)
    pk = connection.ops.quote_name(Deployment._meta.pk.column or "id")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET last_seq = last_seq + %s WHERE {pk} = %s "
                       "RETURNING last_seq", [count, deployment_id])
        row = cursor.fetchone()
    if row is None:
        raise Deployment.DoesNotExist(f"no deployment {deployment_id}")
    return int(row[0]) - count + 1


@cache
def _json_string(text: str) -> str:
    return json.dumps(text)


def _wire(seq: int, stamp: str, kind: str, payload_json: str) -> str:
    """The live entry's data: the JSON of Event.to_wire(), made from the encoded payload."""
    return f'{{"seq":{seq},"ts":"{stamp}","kind":{_json_string(kind)},"payload":{payload_json}}}'


def _copy(deployment_id: int, first: int, stamp: str, items: Items,
          encoded: list[str]) -> None:
    """PostgreSQL's COPY (text format) of the batch as one block: INSERT's per-value quoting
    and psycopg's per-row adaptation were most of the write. The JSON is ASCII
    (ensure_ascii) with its control characters escaped, so COPY's only special character
    in it is the backslash."""
    lines = "".join(
        f"{deployment_id}\t{first + i}\t{stamp}\t{kind}\t"
        f"{text.replace(chr(92), chr(92) * 2) if chr(92) in text else text}\n"
        for i, ((kind, _), text) in enumerate(zip(items, encoded, strict=True)))
    columns = "deployment_id, seq, ts, kind, payload"
    with connection.cursor() as cursor, cursor.cursor.copy(
            f"COPY {Event._meta.db_table} ({columns}) FROM STDIN") as copy:
        copy.write(lines)
