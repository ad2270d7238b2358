"""The event log's writes (web/deployments/services/events.py) and their live entries."""

from __future__ import annotations

import json
import time

import pytest

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import live, services
from web.deployments.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

# Text COPY treats backslash, tab and newline specially; the JSON must come back exact.
AWKWARD = ["plain", "back\\slash \\n not a newline", "tab\there", "new\nline", "quote \" it",
           "ünïcödé ✓ 日本", "cr\rbar 50%|#####", "\\", "\\\\N", "\\."]


def _deployment() -> int:
    return deploying.deployment_create(data=spec(), confirm_warnings=True).pk


def _entries(client, pk: int, count: int, limit_s: float = 10) -> list:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        entries = client.xrange(live.stream_key(pk))
        if len(entries) >= count:
            return entries
        time.sleep(0.02)
    return client.xrange(live.stream_key(pk))


def _log(n: int) -> list[tuple[str, dict]]:
    return [("log", {"stream": "stdout", "text": f"{AWKWARD[i % len(AWKWARD)]} {i}"})
            for i in range(n)]


@pytest.mark.parametrize("size", [3, services.events.COPY_MIN_ROWS + 7])
def test_a_batch_comes_back_exactly_as_written_by_insert_or_copy(size, live_channel):  # type: ignore[no-untyped-def]
    pk = _deployment()
    before = Event.objects.filter(deployment_id=pk).count()
    events = _log(size)
    last = services.events_append_batch(deployment_id=pk, events=events)
    stored = list(Event.objects.filter(deployment_id=pk, seq__gt=before).order_by("seq"))
    assert [(e.kind, e.payload) for e in stored] == events
    assert [e.seq for e in stored] == list(range(before + 1, last + 1))


def test_each_live_entry_is_the_stored_events_wire_json(live_channel):  # type: ignore[no-untyped-def]
    pk = _deployment()
    before = Event.objects.filter(deployment_id=pk).count()
    events = _log(120) + [("metric", {"kind": "decode_stats", "accept_len": 3.25, "ok": True})]
    last = services.events_append_batch(deployment_id=pk, events=events)
    entries = _entries(live_channel, pk, last)
    stored = {e.seq: e for e in Event.objects.filter(deployment_id=pk)}
    assert [live.seq_of(entry_id) for entry_id, _ in entries] == list(range(1, last + 1))
    for entry_id, fields in entries[before:]:
        row = stored[live.seq_of(entry_id)]
        assert list(fields) == [b"data", b"kind"]
        assert fields[b"kind"].decode() == row.kind
        assert json.loads(fields[b"data"]) == row.to_wire()


def test_events_append_returns_its_rows_whose_wire_json_is_the_live_data(live_channel):  # type: ignore[no-untyped-def]
    pk = _deployment()
    rows = services.events_append(deployment_id=pk, events=_log(60))
    first = rows[0].seq
    assert [r.seq for r in rows] == list(range(first, first + 60))
    entries = dict(_entries(live_channel, pk, rows[-1].seq))
    for row in rows:
        assert entries[f"0-{row.seq}".encode()][b"data"].decode() == live.wire_json(row.to_wire())


def test_seqs_stay_gap_free_across_batches_of_both_kinds(live_channel):  # type: ignore[no-untyped-def]
    pk = _deployment()
    services.events_append(deployment_id=pk, events=_log(2))
    services.events_append_batch(deployment_id=pk, events=_log(80))
    services.events_append_batch(deployment_id=pk, events=[])
    services.events_append(deployment_id=pk, events=_log(1))
    seqs = list(Event.objects.filter(deployment_id=pk).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_batch_for_a_missing_deployment_is_refused_and_stores_nothing():  # type: ignore[no-untyped-def]
    from web.deployments.models import Deployment

    with pytest.raises(Deployment.DoesNotExist):
        services.events_append_batch(deployment_id=987654, events=_log(3))
    assert not Event.objects.filter(deployment_id=987654).exists()


def test_a_live_entry_that_lost_a_race_is_skipped_and_the_rest_are_added(live_channel):  # type: ignore[no-untyped-def]
    live.publish_entries(424242, [(5, "log", '{"seq":5}')])
    live.publish_entries(424242, [(4, "log", '{"seq":4}'), (6, "log", '{"seq":6}'),
                                  (7, "end", '{"seq":7}')])
    entries = live_channel.xrange(live.stream_key(424242))
    assert [(live.seq_of(i), f[b"kind"], f[b"data"]) for i, f in entries] == [
        (5, b"log", b'{"seq":5}'), (6, b"log", b'{"seq":6}'), (7, b"end", b'{"seq":7}')]


def test_an_append_racing_a_delete_leaves_no_event_behind(live_channel):  # type: ignore[no-untyped-def]
    # The events table has no foreign key (models.Event.deployment): the row lock that
    # deployment_delete takes is what keeps an append from committing after the delete.
    import threading

    from django.db import connection, transaction

    from web.deployments.models import Deployment

    pk = _deployment()
    services.events_append_batch(deployment_id=pk, events=_log(60))
    outcome: list[str] = []
    locked = threading.Event()

    def append() -> None:
        locked.wait(10)
        try:
            services.events_append_batch(deployment_id=pk, events=_log(60))
            outcome.append("stored")
        except Deployment.DoesNotExist:
            outcome.append("refused")
        finally:
            connection.close()

    writer = threading.Thread(target=append)
    writer.start()
    with transaction.atomic():
        Deployment.objects.select_for_update().get(pk=pk)  # as deployment_delete does first
        locked.set()
        time.sleep(0.5)  # the append is waiting on the row now
        Deployment.objects.filter(pk=pk).delete()
    writer.join(10)
    assert outcome == ["refused"]
    assert not Event.objects.filter(deployment_id=pk).exists()


def test_a_batch_under_another_agents_lease_is_refused_and_stores_nothing(live_channel):  # type: ignore[no-untyped-def]
    from web.deployments.models import Deployment

    pk = _deployment()
    Deployment.objects.filter(pk=pk).update(agent_id="agent@other")
    before = Deployment.objects.values_list("last_seq", flat=True).get(pk=pk)
    with pytest.raises(Deployment.DoesNotExist):
        services.events_append_batch(deployment_id=pk, events=_log(5), owner="agent@me",
                                     row={"log_cursor": "123:1"})
    row = Deployment.objects.get(pk=pk)
    assert (row.last_seq, row.log_cursor) == (before, "")
    assert Event.objects.filter(deployment_id=pk).count() == before


def test_the_leaseholders_batch_sets_the_cursor_progress_and_decode_stats_with_its_rows(live_channel):  # type: ignore[no-untyped-def]
    from web.deployments.models import Deployment

    pk = _deployment()
    Deployment.objects.filter(pk=pk).update(agent_id="agent@me")
    decode = {"kind": "decode_stats", "accept_len": 3.25, "tokens": 7}
    last = services.events_append_batch(
        deployment_id=pk, events=_log(4), owner="agent@me",
        row={"log_cursor": "1764581245000000000:2", "progress": {"capture": {"done": 3}},
             "decode_stats": decode})
    row = Deployment.objects.get(pk=pk)
    assert (row.last_seq, row.log_cursor) == (last, "1764581245000000000:2")
    assert (row.progress, row.decode_stats) == ({"capture": {"done": 3}}, decode)
    assert list(Event.objects.filter(deployment_id=pk).values_list("seq", flat=True)) == list(
        range(1, last + 1))


def test_a_log_lines_live_data_is_the_json_encoders_own_text_byte_for_byte(live_channel):  # type: ignore[no-untyped-def]
    pk = _deployment()
    events = _log(len(AWKWARD)) + [("log", {"text": "keys the other way", "stream": "stderr"})]
    last = services.events_append_batch(deployment_id=pk, events=events)
    entries = _entries(live_channel, pk, last)[-len(events):]
    stored = {e.seq: e for e in Event.objects.filter(deployment_id=pk)}
    for (entry_id, fields), (kind, payload) in zip(entries, events, strict=True):
        row = stored[live.seq_of(entry_id)]
        wire = {"seq": row.seq, "ts": row.ts.isoformat(), "kind": kind, "payload": payload}
        assert fields[b"data"].decode() == live.wire_json(wire)


def test_a_batch_of_several_chunks_is_stored_whole_with_its_cursor_and_live_entries(live_channel):  # type: ignore[no-untyped-def]
    from web.deployments.models import Deployment

    pk = _deployment()
    Deployment.objects.filter(pk=pk).update(agent_id="agent@me")
    before = Deployment.objects.values_list("last_seq", flat=True).get(pk=pk)
    events = _log(2 * services.events.CHUNK_EVENTS + 7)
    last = services.events_append_batch(deployment_id=pk, events=events, owner="agent@me",
                                        row={"log_cursor": "99:3"})
    stored = list(Event.objects.filter(deployment_id=pk, seq__gt=before).order_by("seq"))
    assert [(e.kind, e.payload) for e in stored] == events
    assert [e.seq for e in stored] == list(range(before + 1, last + 1))
    assert Deployment.objects.values_list("log_cursor", flat=True).get(pk=pk) == "99:3"
    entries = _entries(live_channel, pk, last)
    by_seq = {e.seq: e for e in stored}
    for entry_id, fields in entries[before:]:
        assert json.loads(fields[b"data"]) == by_seq[live.seq_of(entry_id)].to_wire()


def test_a_batch_of_several_chunks_under_another_lease_stores_no_chunk(live_channel):  # type: ignore[no-untyped-def]
    from web.deployments.models import Deployment

    pk = _deployment()
    Deployment.objects.filter(pk=pk).update(agent_id="agent@other")
    before = Event.objects.filter(deployment_id=pk).count()
    with pytest.raises(Deployment.DoesNotExist):
        services.events_append_batch(deployment_id=pk, events=_log(3 * services.events.CHUNK_EVENTS),
                                     owner="agent@me", row={"log_cursor": "99:3"})
    assert Event.objects.filter(deployment_id=pk).count() == before
    assert Deployment.objects.values_list("log_cursor", flat=True).get(pk=pk) == ""


def test_a_batch_whose_row_changed_between_its_chunks_stores_nothing(live_channel, monkeypatch):  # type: ignore[no-untyped-def]
    """Each chunk's statement checks the row anew, so the row's cursor moving between two
    of them (another writer's batch committed in between) can refuse one chunk and take a
    later one. The batch is then rolled back whole: a part stored would lose the refused
    chunk's lines for good (the row's cursor would say they were stored). The first
    chunk's check is made to fail here, as it does when it ran before that commit."""
    from web.deployments.models import Deployment
    from web.deployments.services import events as module

    pk = _deployment()
    Deployment.objects.filter(pk=pk).update(log_cursor="10:1")
    before = Deployment.objects.values_list("last_seq", "log_cursor").get(pk=pk)
    stored = Event.objects.filter(deployment_id=pk).count()
    real = module._send_chunk
    calls = []

    def first_one_sees_another_cursor(raw, deployment_id, events, held, row):  # type: ignore[no-untyped-def]
        calls.append(len(events))
        if len(calls) == 1:
            held = {**held, "log_cursor": "9:9"}  # the row as it was before that commit
        return real(raw, deployment_id, events, held, row)

    monkeypatch.setattr(module, "_send_chunk", first_one_sees_another_cursor)
    with pytest.raises(Deployment.DoesNotExist):
        services.events_append_batch(deployment_id=pk, events=_log(3 * module.CHUNK_EVENTS),
                                     expect={"log_cursor": "10:1"}, row={"log_cursor": "20:1"})
    assert calls == [module.CHUNK_EVENTS] * 3
    assert Event.objects.filter(deployment_id=pk).count() == stored
    assert Deployment.objects.values_list("last_seq", "log_cursor").get(pk=pk) == before
    # The same batch sent again once the row holds its cursor is stored whole.
    monkeypatch.setattr(module, "_send_chunk", real)
    last = services.events_append_batch(deployment_id=pk, events=_log(3 * module.CHUNK_EVENTS),
                                        expect={"log_cursor": "10:1"}, row={"log_cursor": "20:1"})
    assert Event.objects.filter(deployment_id=pk).count() == stored + 3 * module.CHUNK_EVENTS
    assert last == before[0] + 3 * module.CHUNK_EVENTS
