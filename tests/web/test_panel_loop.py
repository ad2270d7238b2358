"""The panel loop (web/loop.py): one copy acts, holding a PostgreSQL session advisory lock
on a connection of its own; a second acts once the first's session ends (its connection
killed, its process killed, or its clean stop); a duty that raises never ends the loop; the
re-queue of builds no live worker holds; the own host's join token kept in its file at the
loop's start and hourly, never in its output."""

from __future__ import annotations

import logging
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from tests.fleet.hosts import report
from tests.servers import free_port, panel_loop
from tests.specs import spec
from web.builder.requeue import QUEUED_GRACE_S, REQUEUE_GRACE_S, builds_requeue_dead
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus
from web.fleet import services
from web.fleet.models import FleetHost, JoinToken
from web.fleet.selectors import jointoken_state
from web.loop import LOCK_KEY, OWN_HOST_EVERY_S, Duty, LoopLock, PanelLoop, default_duties

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
                      "retention": 600.0, "own host's join token": 3600.0}


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


@pytest.mark.django_db
def test_a_stop_of_a_run_that_never_started_an_engine_is_ended_when_no_worker_builds_it() -> None:
    """Stopped while building by a worker that died since, or while queued: no agent has it,
    so the loop ends the stop; a build still held, or a run with an engine, is left alone."""
    now = timezone.now()
    rows = {name: deploying.deployment_create(data=spec(name=name, gpus=[i]),
                                              confirm_warnings=True).pk
            for i, name in enumerate(("dead-build", "queued", "live-build", "engine"))}
    lease = {"dead-build": now - timedelta(seconds=1), "live-build": now + timedelta(seconds=20)}
    for name, pk in rows.items():
        Deployment.objects.filter(pk=pk).update(
            status=S.STOPPING, build_lease_until=lease.get(name),
            start_token="t0ken" if name == "engine" else "")
    assert builds_requeue_dead(now=now) == []  # nothing queued: each was stopped
    status = {name: Deployment.objects.get(pk=pk).status for name, pk in rows.items()}
    assert status == {"dead-build": S.STOPPED, "queued": S.STOPPED, "live-build": S.STOPPING,
                      "engine": S.STOPPING}


OWN_HOST = "panel-gpu"


def _own_host_duty() -> Duty:
    """The default duties' own, so the loop's period and function are the ones tested."""
    return next(d for d in default_duties() if d.name == "own host's join token")


def _ran_again(duty: Duty) -> None:
    """The duty run once more (its hour brought forward), and done: due an hour on."""
    duty.due = 0.0
    _until(lambda: duty.due > time.monotonic() + OWN_HOST_EVERY_S / 2, "the duty runs again")


def _file_token(path: Path) -> JoinToken:
    return JoinToken.objects.get(digest=services.secret_digest(path.read_text()))


def _usable(token: JoinToken) -> bool:
    return jointoken_state(token=token, now=timezone.now()) == "usable"


def _no_secret(text: str, secrets: list[str]) -> None:
    assert secrets and all(s.startswith("sdj-") and s not in text for s in secrets), text
    assert not re.search(r"sdj-\w{8,}", text), text


@pytest.mark.django_db(transaction=True)
def test_the_loop_keeps_a_usable_own_host_token_and_replaces_a_spent_revoked_or_expiring_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "own-host" / "token"
    duty = _own_host_duty()
    loop = PanelLoop(duties=[duty])
    secrets: list[str] = []
    with override_settings(OWN_HOST_TOKEN_FILE=str(path), HOST_NAME=OWN_HOST), \
            caplog.at_level(logging.DEBUG), _running(loop):
        # At the loop's start: a usable token for the own host, 0600, that joins it.
        _until(lambda: duty.due > time.monotonic() + OWN_HOST_EVERY_S / 2,
               "the duty runs at the loop's start")
        first = _file_token(path)
        secrets.append(path.read_text())
        assert first.host_name == OWN_HOST and _usable(first)
        assert first.expires_at - timezone.now() > timedelta(days=6)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        expiry = first.expires_at.strftime("%Y-%m-%d %H:%M")
        assert f"is in {path}" in caplog.text and expiry in caplog.text
        assert "(the one there was missing)" in caplog.text

        # An hour on, a usable one is kept.
        _ran_again(duty)
        assert path.read_text() == secrets[-1] and JoinToken.objects.count() == 1
        assert f"in {path} is usable until {expiry} UTC: kept" in caplog.text

        # Spent (the agent joined with it): replaced by one that joins again.
        services.host_join(token=secrets[-1], name=OWN_HOST,
                           facts=services.host_facts_from(report()))
        _ran_again(duty)
        spent = _file_token(path)
        secrets.append(path.read_text())
        assert secrets[-1] != secrets[-2] and _usable(spent)
        assert "(the one there was spent)" in caplog.text

        # Revoked by an operator: replaced.
        services.jointoken_revoke(token_id=spent.pk)
        _ran_again(duty)
        revoked = _file_token(path)
        secrets.append(path.read_text())
        assert secrets[-1] != secrets[-2] and _usable(revoked)
        assert "(the one there was revoked)" in caplog.text

        # Expiring within a day: replaced, and the replaced one (no file holds it) revoked.
        JoinToken.objects.filter(pk=revoked.pk).update(
            expires_at=timezone.now() + timedelta(hours=23))
        _ran_again(duty)
        newest = _file_token(path)
        secrets.append(path.read_text())
        assert newest.pk != revoked.pk and _usable(newest)
        assert "(the one there was expires within a day)" in caplog.text
        revoked.refresh_from_db()
        assert revoked.revoked_at is not None
    services.host_join(token=secrets[-1], name=OWN_HOST,
                       facts=services.host_facts_from(report()))
    assert FleetHost.objects.filter(name=OWN_HOST).exists()
    assert JoinToken.objects.filter(revoked_at__isnull=True, uses=0).count() == 0
    _no_secret(caplog.text, secrets)


@pytest.mark.django_db(transaction=True)
def test_an_own_host_token_folder_that_cannot_be_written_is_said_once_and_tried_an_hour_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "own-host"
    folder.mkdir()
    # The write fails as in a read-only folder, also for root (who may write there anyway).
    (folder / "token.part").mkdir()
    folder.chmod(0o500)
    path = folder / "token"
    duty, after = _own_host_duty(), Counter()
    loop = PanelLoop(duties=[duty, Duty("after", 0, after)])
    with override_settings(OWN_HOST_TOKEN_FILE=str(path), HOST_NAME=OWN_HOST), \
            caplog.at_level(logging.DEBUG), _running(loop) as thread:
        _until(lambda: after.runs >= 10, "ten ticks run after the failed one")
        assert thread.is_alive() and loop.acting.is_set()
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(said) == 1, said
        assert f"cannot keep the own host's join token in {path}" in said[0]
        assert "tried again in an hour" in said[0]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert duty.due > time.monotonic() + OWN_HOST_EVERY_S / 2, "next tried an hour on"
        assert not path.exists() and not JoinToken.objects.exists(), "no token left behind"

        # The folder made writable: the next run (an hour on, brought forward) writes it.
        folder.chmod(0o700)
        (folder / "token.part").rmdir()
        _ran_again(duty)
        assert _file_token(path).host_name == OWN_HOST
    _no_secret(caplog.text, [path.read_text()])


@pytest.mark.django_db(transaction=True)
def test_the_loop_process_writes_the_own_host_token_and_prints_only_path_and_expiry(
        tmp_path: Path) -> None:
    """`python3 -m worker.loop` as compose runs it: the token's file at its start, its
    output naming the file and the expiry, never the token."""
    path, log_path = tmp_path / "own-host" / "token", tmp_path / "loop.log"
    with panel_loop(log_path, APPLIANCE_OWN_HOST_TOKEN_FILE=str(path),
                    APPLIANCE_HOST_NAME=OWN_HOST):
        _until(lambda: "a join token for the own host" in log_path.read_text(),
               "the loop writes the own host's token at its start")
    token = _file_token(path)
    assert token.host_name == OWN_HOST and _usable(token)
    output = log_path.read_text()
    assert f"is in {path}" in output, output
    assert token.expires_at.strftime("%Y-%m-%d %H:%M") in output, output
    _no_secret(output, [path.read_text()])
