"""Appending events to a deployment's log, and publishing them on the live channel.

The engine agent stores tens of thousands of events a second. Its profile
showed most of that time in building Event model instances (Django's pre_init/post_init
signals alone 9 %), encoding each payload twice (COPY, then the live publisher) and a
second query to read the claimed seq back. So a batch is claimed with one
`UPDATE ... RETURNING`, each payload is JSON-encoded once, and that one text is both the
COPY row and the live entry's `data` (the SSE frame's JSON, byte for byte what
`live.wire_json(row.to_wire())` would make).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from appliance import jsontext

from .. import live
from ..models import Deployment, Event
from .reads import deployment_status_bodies_later

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
        # The status reads' answers for the row as this write leaves it (services/reads.py).
        deployment_status_bodies_later(deployment_id=deployment_id)
    return [Event(deployment_id=deployment_id, seq=first + i, kind=kind, payload=payload,
                  ts=now) for i, (kind, payload) in enumerate(items)]


def events_append_batch(*, deployment_id: int, events: Items, owner: str | None = None,
                        row: dict[str, Any] | None = None,
                        expect: dict[str, str] | None = None) -> int:
    """events_append for the engine agent's batches: the same rows and live entries, with
    no model instances made for the caller; returns the last seq (0 for no events).

    With `owner`, the batch is stored only while that agent holds the deployment
    (Deployment.DoesNotExist otherwise, as for a missing deployment, and nothing is
    stored); with `expect` (EXPECT_FIELDS: the start token, the log cursor the batch
    follows), only while the row's fields hold those values, alike. `row` holds deployment
    fields (ROW_FIELDS: the log cursor, progress, the last decode stats) set with the seqs'
    claim, so a batch and its cursor commit together. On
    PostgreSQL all of it is one statement (docs/performance.md, Log path: the lease check,
    the claim, the COPY, the cursor update and the commit were five round trips and about
    1.3 ms of the agent's CPU per batch); outside a transaction it commits on its own."""
    if not events:
        return 0
    held = {**(expect or {}), **({"agent_id": owner} if owner is not None else {})}
    assert set(held) <= EXPECT_FIELDS, held
    if connection.vendor == "postgresql":
        last = _append_in_one_statement(deployment_id, events, held, row or {})
        _bodies_after_batch(deployment_id)
        return last
    with transaction.atomic():
        if _claim_row(deployment_id, held, row or {}) is None:
            raise Deployment.DoesNotExist(f"no deployment {deployment_id} holding {held}")
        first, _ = _store(deployment_id, events, copy_min_rows=1)
    return first + len(events) - 1


# The status reads' stored answers (services/reads.py) after an agent's batch: a
# batch moves the row (its log cursor, decode stats), so the answers stored before it are
# no longer current and reads render the row again. A store costs the writer about 1.5 ms,
# and a busy engine's batches come every few milliseconds: at most one store per
# STATUS_BODIES_EVERY_S per deployment in this process, and one more when its batches stop
# (events_batches_quiet, which the agent's follower calls after a second without one).
STATUS_BODIES_EVERY_S = 0.5
_bodies_at: dict[int, float] = {}
_bodies_due: set[int] = set()


def _bodies_after_batch(deployment_id: int) -> None:
    now = time.monotonic()
    if now - _bodies_at.get(deployment_id, float("-inf")) < STATUS_BODIES_EVERY_S:
        _bodies_due.add(deployment_id)
        return
    _bodies_at[deployment_id] = now
    _bodies_due.discard(deployment_id)
    deployment_status_bodies_later(deployment_id=deployment_id)


def events_batches_quiet(*, deployment_id: int, always: bool = False) -> None:
    """A deployment's batches have stopped for now: store the status reads' answers if a
    batch since the last store left them stale (at once outside a transaction). `always`:
    whatever this process saw (a host's batches may have reached another web process)."""
    if always or deployment_id in _bodies_due:
        _bodies_due.discard(deployment_id)
        _bodies_at[deployment_id] = time.monotonic()
        deployment_status_bodies_later(deployment_id=deployment_id)


ROW_FIELDS = frozenset({"log_cursor", "progress", "decode_stats"})
# The row's fields a batch may be conditional on: the agent's lease, the start, the cursor.
EXPECT_FIELDS = frozenset({"agent_id", "start_token", "log_cursor"})
_PREPARE_ONLY_WHEN_ASKED = 2**62
_JSON_FIELDS = frozenset({"progress", "decode_stats"})


def _claim_row(deployment_id: int, held: dict[str, str], row: dict[str, Any]) -> int | None:
    """The lease check and the row's fields, for databases other than PostgreSQL."""
    found = Deployment.objects.select_for_update().filter(pk=deployment_id, **held)
    if not found.exists():
        return None
    if row:
        Deployment.objects.filter(pk=deployment_id).update(**row)
    return deployment_id


@cache
def _append_sql(fields: tuple[str, ...], held: tuple[str, ...]) -> str:
    """Claim, lease check, row fields and rows in one statement: the UPDATE takes the row
    lock (a takeover or a delete holding it first leaves no row to claim, so nothing is
    inserted) and its RETURNING reads the clock under that lock, so seq follows ts (the
    retention relies on it). The kinds and payloads come as two joined texts (a payload's
    JSON has no raw newline, a kind no space): one parameter each, not one per row."""
    table = connection.ops.quote_name(Deployment._meta.db_table)
    events = connection.ops.quote_name(Event._meta.db_table)
    sets = "".join(f", {connection.ops.quote_name(name)} = %({name})s"
                   + ("::jsonb" if name in _JSON_FIELDS else "") for name in fields)
    lease = "".join(f" AND {connection.ops.quote_name(name)} = %(held_{name})s"
                    for name in held)
    return (
        f"WITH claim AS (UPDATE {table} SET last_seq = last_seq + %(n)s{sets} "
        f"WHERE id = %(pk)s{lease} RETURNING last_seq - %(n)s AS base, clock_timestamp() AS ts), "
        f"stored AS (INSERT INTO {events} (deployment_id, seq, ts, kind, payload) "
        "SELECT %(pk)s, claim.base + e.n, claim.ts, e.kind, e.payload::jsonb FROM claim, "
        "unnest(string_to_array(%(kinds)s, ' '), string_to_array(%(payloads)s, E'\\n')) "
        "WITH ORDINALITY AS e(kind, payload, n)) "
        "SELECT base, ts FROM claim")


def _append_in_one_statement(deployment_id: int, events: Items, held: dict[str, str],
                             row: dict[str, Any]) -> int:
    """One statement per CHUNK_EVENTS; several go pipelined in one transaction, each sent
    as soon as it is encoded, so PostgreSQL stores one while the next is encoded (a busy
    engine's batch of 16,000 events as one statement waited for both in turn: 1.7x the
    time). The row's fields go with the last, so the cursor commits with every row."""
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django turns psycopg's prepared statements off, and then prepare=True is ignored;
        # parsing and planning this statement was 230 us of PostgreSQL's 370 for a batch of
        # ten rows. A threshold no query reaches keeps every other statement as it was.
        raw.prepare_threshold = _PREPARE_ONLY_WHEN_ASKED
    chunks = [events[start:start + CHUNK_EVENTS]
              for start in range(0, len(events), CHUNK_EVENTS)]
    sent: list[tuple[psycopg.Cursor[Any], Items, list[str]]] = []
    # psycopg's own cursor binds on the server (Django's quotes each value into the SQL
    # text: a copy of megabytes per busy batch); Django's wrapper still maps its errors.
    try:
        with connection.wrap_database_errors:
            if len(chunks) == 1:  # outside a transaction: committed on its own, one round trip
                sent.append(_send_chunk(raw, deployment_id, chunks[0], held, row))
                claims = [sent[0][0].fetchone()]
            else:
                with transaction.atomic(savepoint=False):
                    with raw.pipeline():
                        for i, chunk in enumerate(chunks):
                            last = i == len(chunks) - 1
                            sent.append(_send_chunk(raw, deployment_id, chunk, held,
                                                    row if last else {}))
                    # Each statement checks the row anew: where the row changed between
                    # them (a chunk refused, a later one taken), the whole batch is rolled
                    # back, never stored in part.
                    claims = [cursor.fetchone() for cursor, _, _ in sent]
                    if any(claimed is None for claimed in claims):
                        raise Deployment.DoesNotExist(
                            f"no deployment {deployment_id} holding {held}")
    finally:
        for cursor, _, _ in sent:
            cursor.close()
    if claims[0] is None:
        raise Deployment.DoesNotExist(f"no deployment {deployment_id} holding {held}")
    made = [(chunk, encoded, claimed)
            for (_, chunk, encoded), claimed in zip(sent, claims, strict=True)]

    def entries() -> list[live.Entry]:
        return [entry for chunk, encoded, claimed in made
                for entry in _entries(chunk, encoded, claimed)]

    # Outside a transaction the statements have committed and this runs at once. The live
    # entries are made on the publisher's thread: the agent's next batch waits for this
    # answer, and not for them.
    transaction.on_commit(lambda: live.publish_entries_later(deployment_id, entries))
    final = claims[-1]
    assert final is not None  # a batch with a chunk unclaimed was refused above
    return int(final[0]) + len(sent[-1][1])


CHUNK_EVENTS = 2000


def _send_chunk(raw: Any, deployment_id: int, events: Items, held: dict[str, str],
                row: dict[str, Any]) -> tuple[psycopg.Cursor[Any], Items, list[str]]:
    fields = tuple(sorted(name for name in row if name in ROW_FIELDS))
    encoded = [_encode_payload(payload) for _, payload in events]
    params: dict[str, Any] = {
        "n": len(events), "pk": deployment_id,
        **{f"held_{name}": value for name, value in held.items()},
        "kinds": " ".join([kind for kind, _ in events]), "payloads": "\n".join(encoded),
        **{name: _encode(row[name]) if name in _JSON_FIELDS else row[name] for name in fields}}
    cursor = psycopg.Cursor(raw)
    cursor.execute(_append_sql(fields, tuple(sorted(held))), params, prepare=True)
    return cursor, events, encoded


def _entries(events: Items, encoded: list[str], claimed: Any) -> list[live.Entry]:
    first, stamp = int(claimed[0]) + 1, claimed[1].isoformat()
    return [(first + i, kind, _wire(first + i, stamp, kind, text))
            for i, ((kind, _), text) in enumerate(zip(events, encoded, strict=True))]


def _store(deployment_id: int, items: Items,
           copy_min_rows: int = COPY_MIN_ROWS) -> tuple[int, datetime]:
    """Claim seqs, write the rows, and publish them once the transaction commits."""
    first = _claim_seqs(deployment_id, len(items))
    now = timezone.now()
    stamp = now.isoformat()
    encoded = [_encode_payload(payload) for _, payload in items]
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


def _encode_payload(payload: dict[str, Any]) -> str:
    """A payload's compact JSON (appliance.jsontext), once: the COPY row and the live entry."""
    return jsontext.dumps_text(payload)


@cache
def _json_string(text: str) -> str:
    return jsontext.dumps_text(text)


def _wire(seq: int, stamp: str, kind: str, payload_json: str) -> str:
    """The live entry's data: the JSON of Event.to_wire(), made from the encoded payload."""
    return f'{{"seq":{seq},"ts":"{stamp}","kind":{_json_string(kind)},"payload":{payload_json}}}'


def _copy(deployment_id: int, first: int, stamp: str, items: Items,
          encoded: list[str]) -> None:
    """PostgreSQL's COPY (text format) of the batch as one block: INSERT's per-value quoting
    and psycopg's per-row adaptation were most of the write. The JSON has its control
    characters escaped (a newline or tab never raw), so COPY's only special character
    in it is the backslash."""
    lines = "".join(
        f"{deployment_id}\t{first + i}\t{stamp}\t{kind}\t"
        f"{text.replace(chr(92), chr(92) * 2) if chr(92) in text else text}\n"
        for i, ((kind, _), text) in enumerate(zip(items, encoded, strict=True)))
    columns = "deployment_id, seq, ts, kind, payload"
    with connection.cursor() as cursor, cursor.cursor.copy(
            f"COPY {Event._meta.db_table} ({columns}) FROM STDIN") as copy:
        copy.write(lines)
