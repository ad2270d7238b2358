"""The detail page's log: it opens at the tail, pages history by seq, filters and searches on
the server, and downloads the whole log as streamed text (real PostgreSQL)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.eventfill import PHASE_EVERY, WARN_EVERY, fill_events
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import logpane, selectors
from web.deployments.history_views import DOWNLOAD_PAGE
from web.deployments.models import LINE_KINDS, Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer_client(viewer) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(viewer)
    return client


@pytest.fixture
def busy() -> int:
    """A deployment with 120,000 events after its own (pre-flight, queued)."""
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    fill_events(deployment_id=pk, count=120_000)
    return pk


def _history(client: Client, pk: int, **params: Any) -> dict[str, Any]:
    response = client.get(reverse("deployments:events", args=[pk]), params)
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def _tail(html: str) -> list[dict[str, Any]]:
    found = re.search(r'<script id="log-tail" type="application/json">(.*?)</script>', html, re.S)
    assert found is not None
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def test_the_page_carries_the_last_lines_only_and_the_seq_to_go_on_from(viewer_client, busy):  # type: ignore[no-untyped-def]
    response = viewer_client.get(reverse("deployments:detail", args=[busy]))
    html = response.content.decode()
    tail = _tail(html)
    last = selectors.deployment_get(deployment_id=busy).last_seq
    assert len(tail) == logpane.TAIL_LINES
    assert tail[-1]["seq"] == last - 1  # the newest line (the last event is its metric)
    assert [e["seq"] for e in tail] == sorted(e["seq"] for e in tail)
    assert {e["kind"] for e in tail} <= {"log", "phase"}
    assert f'data-after="{last}"' in html
    assert len(response.content) < 300_000  # not the 120,000 events


def test_scrolling_back_pages_older_lines_by_seq_without_gaps(viewer_client, busy):  # type: ignore[no-untyped-def]
    first = _history(viewer_client, busy, limit=200)
    older = _history(viewer_client, busy, limit=200, before=first["next_before"])
    seqs = [e["seq"] for e in older["events"] + first["events"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == 400
    assert older["events"][-1]["seq"] < first["events"][0]["seq"] == first["next_before"]
    # Every line in that range, and lines only (the metric event after a decode line is none).
    assert seqs == list(Event.objects.filter(
        deployment_id=busy, kind__in=LINE_KINDS, seq__gte=seqs[0], seq__lte=seqs[-1],
    ).order_by("seq").values_list("seq", flat=True))
    newer = _history(viewer_client, busy, limit=200, after=older["events"][-1]["seq"])
    assert [e["seq"] for e in newer["events"]] == seqs[200:]


def test_one_page_of_history_is_one_query_on_the_index(viewer_client, busy):  # type: ignore[no-untyped-def]
    with CaptureQueriesContext(connection) as queries:
        _history(viewer_client, busy, limit=200, before=60_001)
    history = [q["sql"] for q in queries.captured_queries if "deployments_event" in q["sql"]]
    assert len(history) == 1
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + history[0])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "event_seq_unique" in plan and "Seq Scan" not in plan, plan


def test_a_kind_filter_finds_the_rare_phases_among_a_hundred_thousand_lines(viewer_client, busy):  # type: ignore[no-untyped-def]
    page = _history(viewer_client, busy, kind="phase", limit=50)
    assert {e["kind"] for e in page["events"]} == {"phase"}
    filled = [e for e in page["events"] if e["payload"]["message"].startswith("marker")]
    assert [e["seq"] % PHASE_EVERY for e in filled] == [0, 0]
    assert filled[-1]["payload"]["message"] == f"marker {filled[-1]['seq']}"
    with CaptureQueriesContext(connection) as queries:
        _history(viewer_client, busy, kind="phase,diagnosis", limit=50)
    sql = next(q["sql"] for q in queries.captured_queries if "deployments_event" in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "event_notable" in plan, plan


def test_a_search_reads_a_bounded_window_and_says_where_to_go_on(viewer_client, busy):  # type: ignore[no-untyped-def]
    page = _history(viewer_client, busy, q="kv cache USAGE", limit=500)
    seqs = [e["seq"] for e in page["events"]]
    assert seqs and all(s % WARN_EVERY == 0 for s in seqs)
    last = selectors.deployment_get(deployment_id=busy).last_seq
    assert page["next_before"] == last + 1 - logpane.SEARCH_WINDOW
    assert len(seqs) == logpane.SEARCH_WINDOW // WARN_EVERY
    older = _history(viewer_client, busy, q="kv cache usage", before=page["next_before"])
    assert max(e["seq"] for e in older["events"]) < min(seqs)
    # A text that is nowhere: each request still answers, window by window, to the start.
    before, requests = None, 0
    while True:
        params = {"q": "no such text %_", "limit": 100}
        if before:
            params["before"] = before
        nothing = _history(viewer_client, busy, **params)
        assert nothing["events"] == []
        requests += 1
        before = nothing["next_before"]
        if before is None:
            break
    assert requests == -(-(last + 1) // logpane.SEARCH_WINDOW)


@pytest.mark.parametrize(("params", "field", "says"), [
    ({"before": "x"}, "before", "whole number"),
    ({"limit": "100000"}, "limit", "1000"),
    ({"kind": "log,bogus"}, "kind", "unknown kind bogus"),
    ({"before": "5", "after": "2"}, "query", "not both"),
    ({"q": "x" * 300}, "q", "200"),
])
def test_a_bad_query_is_a_400_naming_the_parameter(viewer_client, busy, params, field, says):  # type: ignore[no-untyped-def]
    response = viewer_client.get(reverse("deployments:events", args=[busy]), params)
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert says in " ".join(errors[field])


def test_the_history_needs_the_viewer_role_and_a_deployment(client, busy, django_user_model):  # type: ignore[no-untyped-def]
    url = reverse("deployments:events", args=[busy])
    assert client.get(url).status_code == 302  # to the login page
    client.force_login(django_user_model.objects.create_user(username="nobody", password="x1"))
    assert client.get(url).status_code == 403
    assert client.get(reverse("deployments:log", args=[busy])).status_code == 403


@pytest.mark.django_db(transaction=True)  # the download reads on threads of its own
def test_the_download_streams_every_line_of_the_log_as_text(viewer_client, busy):  # type: ignore[no-untyped-def]
    response = viewer_client.get(reverse("deployments:log", args=[busy]))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Disposition"].startswith("attachment; filename=")

    async def read() -> list[bytes]:
        return [chunk async for chunk in response.streaming_content]  # type: ignore[attr-defined]

    chunks = async_to_sync(read)()
    lines = b"".join(chunks).decode().splitlines()
    expected = Event.objects.filter(deployment_id=busy, kind__in=LINE_KINDS).count()
    assert len(lines) == expected > 60_000
    assert len(chunks) >= expected // DOWNLOAD_PAGE  # a page at a time, not built whole
    seqs = [int(line.split(" ", 2)[1][1:]) for line in lines]
    assert seqs == sorted(seqs)
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z #\d+ \[stderr\] .*WARNING",
                    next(line for line in lines if "WARNING" in line))
    assert any(re.search(r"#\d+ \[phase\] ready marker \d+$", line) for line in lines)
