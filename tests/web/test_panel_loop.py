"""The panel loop (web/loop.py): one copy acts, holding a PostgreSQL session advisory lock
on a connection of its own; a second acts once the first's session ends (its connection
killed, its process killed, or its clean stop); a duty that raises never ends the loop; the
re-queue of builds no live worker holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tests.servers import free_port, panel_loop
from tests.specs import spec
from web.builder.requeue import QUEUED_GRACE_S, REQUEUE_GRACE_S, builds_requeue_dead
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus
from web.loop import LOCK_KEY, Duty, LoopLock, PanelLoop, default_duties

S = DeploymentStatus
REQUEUED = "the build's worker went away; the build was queued again"
TICK_S = 0.05
BOUND_S = 10.0  # every wait here on another thread or process


class Counter:
    """A duty that counts its runs, raising each time if told to."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.runs = 0
        self.raises = raises

    def __call__(self) -> None:
        self.runs += 1
        if self.raises is not None:
            raise self.raises


def _until(check: Callable[[], object], what: str, timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@contextmanager
def _running(loop: PanelLoop) -> Iterator[threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop, TICK_S), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=BOUND_S)
        assert not thread.is_alive(), "the loop ends within a bound once stopped"


def _counting_loop() -> tuple[PanelLoop, Counter]:
    counter = Counter()
    return PanelLoop(duties=[Duty("count", 0, counter)]), counter


def _lock_holders() -> list[int]:
    """The server processes holding the loop's lock in this database (pg_locks)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND ((classid::bigint << 32) | objid::bigint) = %s", [LOCK_KEY])
        return [row[0] for row in cursor.fetchall()]


def _steady(loop: PanelLoop, counter: Counter, acts: bool) -> None:
    """Over a few ticks, `counter` grows exactly when `acts`."""
    before = counter.runs
    time.sleep(10 * TICK_S)
    assert loop.acting.is_set() is acts
    assert (counter.runs > before) is acts, (before, counter.runs)


@pytest.mark.django_db(transaction=True)
def test_one_of_two_loops_acts_and_the_other_takes_over_when_its_session_is_killed() -> None:
    first, first_runs = _counting_loop()
    second, second_runs = _counting_loop()
    with _running(first):
        _until(first.acting.is_set, "the first loop takes the free lock")
        with _running(second):
            _until(lambda: second.lock.conn is not None, "the second loop connects")
            _steady(first, first_runs, acts=True)
            _steady(second, second_runs, acts=False)
            assert _lock_holders() == [first.lock.backend_pid]

            # The first's lock session ends on the server (as a killed process's does, or a
            # broken connection's): the second acts within a tick or two, and the first,
            # whose check of its session fails, stops acting and finds the lock taken.
            killed = first.lock.backend_pid
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [killed])
            ended = time.monotonic()
            _until(second.acting.is_set, "the second loop takes the lock over")
            took = time.monotonic() - ended
            _until(lambda: not first.acting.is_set(), "the first loop stops acting")
            _steady(first, first_runs, acts=False)
            _steady(second, second_runs, acts=True)
            assert _lock_holders() == [second.lock.backend_pid]
            assert first.lock.backend_pid not in (None, killed), "it connected again"
            print(f"lock taken over {took * 1000:.0f} ms after the session ended")

        # A clean stop ends the second's session: the first acts again at its next tick.
        _until(first.acting.is_set, "the first loop takes the lock back after the stop")
        _steady(first, first_runs, acts=True)


@pytest.mark.django_db(transaction=True)
def test_a_killed_loop_process_hands_the_lock_over(tmp_path: Path) -> None:
    """`python3 -m worker.loop` as compose runs it holds the lock; SIGKILL ends its session,
    so a waiting loop acts within a bound."""
    waiting, waiting_runs = _counting_loop()
    with panel_loop(tmp_path / "loop.log", APPLIANCE_LOOP_TICK_MS="100") as process:
        _until(lambda: "panel loop: acting" in (tmp_path / "loop.log").read_text(),
               "the process takes the free lock")
        with _running(waiting):
            _until(lambda: waiting.lock.conn is not None, "the waiting loop connects")
            _steady(waiting, waiting_runs, acts=False)
            assert len(_lock_holders()) == 1
            assert _lock_holders() != [waiting.lock.backend_pid]
            process.kill()
            process.wait(timeout=BOUND_S)
            killed = time.monotonic()
            _until(waiting.acting.is_set, "the waiting loop acts once the process is gone")
            print(f"lock taken over {(time.monotonic() - killed) * 1000:.0f} ms after SIGKILL")
            _steady(waiting, waiting_runs, acts=True)


@pytest.mark.django_db(transaction=True)
def test_a_duty_that_raises_never_stops_the_loop_nor_the_duties_after_it() -> None:
    def bad_sql() -> None:  # a database error leaves this thread's connection aborted
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    crashing, failing_sql = Counter(RuntimeError("a duty's bug")), Counter()
    after = Counter()
    reads: list[int] = []
    periodic = Counter()
    loop = PanelLoop(duties=[
        Duty("crashing", 0, crashing),
        Duty("bad SQL", 0, lambda: (failing_sql(), bad_sql())),
        Duty("after", 0, after),
        # The database is usable again the next duty: the loop closed the broken connection.
        Duty("read", 0, lambda: reads.append(Deployment.objects.count())),
        Duty("periodic", 1.0, periodic),
    ])
    started = time.monotonic()
    with _running(loop) as thread:
        _until(lambda: after.runs >= 10 and len(reads) >= 10, "ten ticks run")
        assert thread.is_alive() and loop.acting.is_set()
    elapsed = time.monotonic() - started
    # A failing duty stays due: tried again each tick.
    assert crashing.runs >= 10 and failing_sql.runs >= 10
    assert set(reads) == {0}
    # A duty due every second runs once a second, not each tick.
    assert 1 <= periodic.runs <= int(elapsed) + 1, (periodic.runs, elapsed)


class _AwayLock(LoopLock):
    """The loop's lock, its server away (a port nothing listens on) while `away` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.away = threading.Event()
        self.closed_port = free_port()

    def address(self) -> dict[str, Any]:
        address = super().address()
        if self.away.is_set():
            return {**address, "host": "127.0.0.1", "port": self.closed_port}
        return address


@pytest.mark.django_db(transaction=True)
def test_the_loop_acts_only_while_it_reaches_the_database() -> None:
    """A lock connection that cannot be made (the server away) is no lock: nothing acts,
    nothing raises, and the lock is taken once the server answers again."""
    lock = _AwayLock()
    lock.away.set()
    runs = Counter()
    loop = PanelLoop(duties=[Duty("count", 0, runs)], lock=lock)
    with _running(loop) as thread:
        time.sleep(10 * TICK_S)
        assert thread.is_alive() and not loop.acting.is_set() and runs.runs == 0
        lock.away.clear()
        _until(loop.acting.is_set, "the lock is taken once the database answers")
        _until(lambda: runs.runs > 0, "the duties run")


def test_the_default_duties_and_their_periods() -> None:
    duties = {d.name: d.every_s for d in default_duties()}
    assert duties == {"rolling changes": 0, "builds' re-queue": 0, "Tune sweep": 10.0,
                      "retention": 600.0}


@pytest.mark.django_db
def test_builds_no_live_worker_holds_are_queued_again_once(
        django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    now = timezone.now()
    dead = deploying.deployment_create(data=spec(name="dead-build"), confirm_warnings=True)
    forgotten = deploying.deployment_create(data=spec(name="forgotten", gpus=[1]),
                                            confirm_warnings=True)
    fresh = deploying.deployment_create(data=spec(name="fresh", gpus=[2]), confirm_warnings=True)
    working = deploying.deployment_create(data=spec(name="working", gpus=[3]),
                                          confirm_warnings=True)
    Deployment.objects.filter(pk=dead.pk).update(
        status=S.BUILDING, build_owner="worker@gone", build_lease_until=now - timedelta(seconds=1))
    Deployment.objects.filter(pk=working.pk).update(
        status=S.BUILDING, build_owner="worker@alive",
        build_lease_until=now + timedelta(seconds=20))
    Deployment.objects.filter(pk=forgotten.pk).update(
        updated_at=now - timedelta(seconds=QUEUED_GRACE_S + 1))
    with django_capture_on_commit_callbacks() as sent:
        assert sorted(builds_requeue_dead(now=now)) == sorted([dead.pk, forgotten.pk])
    jobs = [c for c in sent if c.__qualname__.startswith("_send_on_commit")]
    assert len(jobs) == 2, "one deploy job each (web/tasks.py sends it once committed)"
    for pk in (dead.pk, forgotten.pk):
        row = Deployment.objects.get(pk=pk)
        assert row.build_owner == "" and row.build_lease_until == now + timedelta(
            seconds=REQUEUE_GRACE_S)
        assert row.events.filter(kind="status", payload__message=REQUEUED).count() == 1
    # The lease set at the re-queue keeps the next ticks from sending it again meanwhile.
    with django_capture_on_commit_callbacks() as sent:
        assert builds_requeue_dead(now=now + timedelta(seconds=1)) == []
    assert not sent
    assert not Deployment.objects.get(pk=fresh.pk).events.filter(
        payload__message=REQUEUED).exists()
    assert Deployment.objects.get(pk=working.pk).build_owner == "worker@alive"
