"""The event log's retention (services/retention.py) on real PostgreSQL: old stats lines are
folded into the metric series and removed, old chatter goes, and everything a diagnosis needs
stays (docs/events-retention.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import NOTABLE_KINDS, Deployment, Event, MetricPoint
from web.deployments.services.retention import CONTEXT, RUN_HEAD, events_prune

pytestmark = pytest.mark.django_db

P = "[2026-12-01 09:00:00 TP0] "
TRACEBACK = [
    P + "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl/scheduler.py", line 10, in event_loop',
    "    self.run_batch(batch)",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]


def _decode(i: int) -> list[tuple[str, dict[str, Any]]]:
    """A decode line as the follower stores it: the log line and its metric event."""
    return [("log", {"stream": "stdout", "text": P + f"Decode batch, #running-req: 2, "
                     f"accept len: 3.00, gen throughput (token/s): {100 + i % 10}.00"}),
            ("metric", {"kind": "decode_stats", "running_req": 2, "accept_len": 3.0,
                        "accept_rate": 0.4, "gen_throughput": 100.0 + i % 10,
                        "cuda_graph": True, "queue_req": 0, "token_usage": 0.05})]


def _chatter(n: int, what: str) -> list[tuple[str, dict[str, Any]]]:
    return [("log", {"stream": "stdout", "text": P + f"{what} request {i}"}) for i in range(n)]


def _append(pk: int, events: list[tuple[str, dict[str, Any]]], at: datetime,
            step_s: float = 0.0) -> range:
    """Append events (the real service), then date them from `at`, step_s apart."""
    rows = services.events_append(deployment_id=pk, events=events)
    first, last = rows[0].seq, rows[-1].seq
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Event._meta.db_table} SET ts = %s + (seq - %s) * "
                       "make_interval(secs => %s) WHERE deployment_id = %s AND seq BETWEEN "
                       "%s AND %s", [at, first, step_s, pk, first, last])
    return range(first, last + 1)


def _texts(pk: int, seqs: range) -> list[str]:
    return [e.payload.get("text", "") for e in
            Event.objects.filter(deployment_id=pk, seq__in=seqs).order_by("seq")]


@pytest.fixture
def old_log() -> dict[str, Any]:
    """Forty days of a deployment, in the order it happened."""
    now = timezone.now()
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    month = now - timedelta(days=40)
    Event.objects.filter(deployment_id=pk).update(ts=month)
    seen: dict[str, Any] = {"pk": pk, "now": now}
    created = Deployment.objects.get(pk=pk).last_seq  # pre-flight and its markers
    seen["head"] = _append(pk, _chatter(RUN_HEAD - created, "early"), month)
    seen["old_chatter"] = _append(pk, _chatter(3000, "Receive"), month)
    seen["traceback"] = _append(pk, [("log", {"stream": "stderr", "text": t})
                                     for t in TRACEBACK], month)
    seen["after_traceback"] = _append(pk, _chatter(200, "Receive"), month)
    seen["notable"] = _append(pk, [
        ("log", {"stream": "stderr", "text": P + "WARNING: KV cache usage high"}),
        ("log", {"stream": "stdout", "text": P + "Capture cuda graph begin. This can take up "
                 "to several minutes."}),
        ("phase", {"status": "ready", "message": ""}),
    ], month)
    seen["late_chatter"] = _append(pk, _chatter(CONTEXT + 300, "Receive"), month)
    seen["alert"] = _append(pk, [("alert", {"id": "stall", "state": "resolved",
                                            "summary": "moving again"})], month)
    seen["after_alert"] = _append(pk, _chatter(CONTEXT + 300, "Receive"), month)
    two_days = now - timedelta(days=2)
    stats = [e for i in range(1200) for e in _decode(i)]  # 2,400 events, 20 minutes
    start = two_days.replace(second=0, microsecond=0)
    seen["stats_start"] = start
    seen["stats"] = _append(pk, stats, start, step_s=0.5)
    seen["diagnosis"] = _append(pk, [("diagnosis", {"cause": "eager-decoding", "fatal": False,
                                                    "summary": "decoding without CUDA graphs",
                                                    "fix": "x"})], start + timedelta(minutes=20))
    seen["recent_stats"] = _append(pk, [e for i in range(100) for e in _decode(i)],
                                   now - timedelta(hours=1))
    # One minute of the old stats that the engine's /metrics covered already.
    MetricPoint.objects.create(deployment_id=pk, ts=start + timedelta(minutes=5, seconds=8),
                               resolution_s=2, throughput=55.0)
    return seen


def test_old_stats_are_folded_into_the_series_and_removed(old_log):  # type: ignore[no-untyped-def]
    pk = old_log["pk"]
    report = events_prune(now=old_log["now"])
    stats = old_log["stats"]
    left = Event.objects.filter(deployment_id=pk, seq__in=stats)
    # Only the lines just before the diagnosis stay (it is shown with its context).
    assert set(left.values_list("seq", flat=True)) == set(
        range(old_log["diagnosis"][0] - CONTEXT, stats[-1] + 1))
    assert report.stats_deleted == len(stats) - CONTEXT
    points = list(MetricPoint.objects.filter(deployment_id=pk, resolution_s=60).order_by("ts"))
    start = old_log["stats_start"]
    minutes = [(p.ts - start).total_seconds() / 60 for p in points]
    # A point per minute the series had none for (minute 5 had one from /metrics).
    assert minutes == [m for m in range(20) if m != 5]
    assert report.folded_points == 19
    full = points[:-1]  # the last minute lost the lines the diagnosis keeps
    assert [(p.throughput, p.accept_len, p.running, p.cuda_graph) for p in full] == [
        (pytest.approx(104.5), 3.0, 2.0, 1.0)] * len(full)
    # The last day's stats are all still there, lines and metrics.
    assert Event.objects.filter(deployment_id=pk, seq__in=old_log["recent_stats"]).count() == 200


def test_old_chatter_goes_and_what_a_diagnosis_needs_stays(old_log):  # type: ignore[no-untyped-def]
    pk = old_log["pk"]
    kinds_before = Event.objects.filter(deployment_id=pk, kind__in=NOTABLE_KINDS).count()
    _texts_before = {"late": _texts(pk, old_log["late_chatter"]),
                     "after": _texts(pk, old_log["after_alert"])}
    report = events_prune(now=old_log["now"])
    assert _texts(pk, old_log["old_chatter"]) == []
    assert _texts(pk, old_log["after_traceback"]) == []
    assert report.lines_deleted == 3000 + 200 + 300 + 300
    # Kept: the log's first lines, the whole traceback, warnings, capture lines, every
    # event of a rare kind, and the lines just before an alert.
    assert len(_texts(pk, old_log["head"])) == len(old_log["head"])
    assert _texts(pk, old_log["traceback"]) == TRACEBACK
    assert Event.objects.filter(deployment_id=pk, seq__in=old_log["notable"]).count() == 3
    assert Event.objects.filter(deployment_id=pk, kind__in=NOTABLE_KINDS).count() == kinds_before
    assert _texts(pk, old_log["late_chatter"]) == _texts_before["late"][-CONTEXT:]
    assert _texts(pk, old_log["after_alert"]) == _texts_before["after"][:CONTEXT]
    assert Deployment.objects.get(pk=pk).log_pruned_seq == old_log["after_alert"][-1]


def test_a_second_pass_finds_nothing_more_to_do(old_log):  # type: ignore[no-untyped-def]
    events_prune(now=old_log["now"])
    count = Event.objects.filter(deployment_id=old_log["pk"]).count()
    again = events_prune(now=old_log["now"])
    assert (again.stats_deleted, again.lines_deleted, again.folded_points) == (0, 0, 0)
    assert Event.objects.filter(deployment_id=old_log["pk"]).count() == count


def test_each_run_keeps_its_first_lines() -> None:
    now = timezone.now()
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    Event.objects.filter(deployment_id=pk).update(ts=now - timedelta(days=40))
    _append(pk, _chatter(RUN_HEAD, "first run"), now - timedelta(days=40))
    run = _append(pk, [("phase", {"status": "starting", "message": ""})]
                  + _chatter(RUN_HEAD + 100, "second run"), now - timedelta(days=35))
    _append(pk, _chatter(10, "today"), now)
    events_prune(now=now)
    kept = _texts(pk, run)
    assert len(kept) == RUN_HEAD + 1 and kept[0] == "" and kept[-1].endswith("request 1999")


def test_the_management_command_says_what_it_removed(old_log):  # type: ignore[no-untyped-def]
    out = StringIO()
    call_command("prune_events", stdout=out)
    assert "stats rows folded and removed" in out.getvalue()
    assert re.search(r"\b3800 log lines past the retention removed", out.getvalue())


def test_a_retention_under_a_day_is_refused_at_start() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "web.settings",
             "APPLIANCE_EVENTS_RETENTION_DAYS": "0"},
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "APPLIANCE_EVENTS_RETENTION_DAYS" in result.stderr
