"""Shared fixtures: named actors, a clean live channel."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group, Permission

from tests.models import write_models
from tests.worktree import worktree_changes, worktree_check_enabled, worktree_snapshot
from web.deployments.management.commands.bootstrap import ROLES

# The suite's specs set the test engine's TEST_ENGINE_* knobs (appliance.engine.envkeys):
# allowed here, in this process and in the panel, worker and agent processes it starts.
os.environ["APPLIANCE_ENGINE_TEST_ENV"] = "1"
# The model folders the suite's specs name (/models/<name>), real and small, outside the work
# tree: pre-flight refuses a path with no checkpoint. Here and in the processes it starts.
MODELS_ROOT = write_models(Path(tempfile.mkdtemp(prefix="appliance-models-")))
atexit.register(shutil.rmtree, MODELS_ROOT, True)
os.environ["APPLIANCE_MODEL_ROOTS"] = str(MODELS_ROOT)
# The panel loops the suite starts keep the own host's join token here, not in the machine's
# /var/lib/appliance (each pytest process its own folder: its own database's token).
OWN_HOST_DIR = Path(tempfile.mkdtemp(prefix="appliance-own-host-"))
atexit.register(shutil.rmtree, OWN_HOST_DIR, True)
os.environ["APPLIANCE_OWN_HOST_TOKEN_FILE"] = str(OWN_HOST_DIR / "token")


@pytest.fixture(autouse=True)
def _test_engine_env(settings):  # type: ignore[no-untyped-def]
    settings.ENGINE_TEST_ENV = True
    settings.MODEL_ROOTS = [str(MODELS_ROOT)]


def _role(name: str) -> Group:
    group, _ = Group.objects.get_or_create(name=name)
    group.permissions.set(Permission.objects.filter(codename__in=ROLES[name]))
    return group


@pytest.fixture
def admin(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_superuser(username="ada", password="admin-pass-1")


@pytest.fixture
def operator(django_user_model):  # type: ignore[no-untyped-def]
    user = django_user_model.objects.create_user(username="otto", password="operator-pass-1")
    user.groups.add(_role("operator"))
    return user


@pytest.fixture
def viewer(django_user_model):  # type: ignore[no-untyped-def]
    user = django_user_model.objects.create_user(username="vera", password="viewer-pass-1")
    user.groups.add(_role("viewer"))
    return user


@pytest.fixture
def token_for():  # type: ignore[no-untyped-def]
    """A hashed API token (web/accounts) for a user: the token itself, as shown once."""
    from web.accounts.tokens import token_create

    def make(user):  # type: ignore[no-untyped-def]
        return token_create(username=user.username)[1]

    return make


@pytest.fixture(scope="session", autouse=True)
def _no_stale_live_streams() -> None:
    """The run's Redis db holds no deployment's live streams when the run starts. The test
    database is made anew for each run, so its deployment ids start again at 1, while Redis
    keeps what an earlier run (or a test that published without `live_channel`) left: a page
    following deployment 1 would replay that run's events (a status of `ready`, alerts) and
    the stream would skip this run's entries whose sequence numbers are not above the old."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    try:
        for key in client.scan_iter("appliance:deployment:*"):
            client.delete(key)
    except redis.ConnectionError:
        pass  # no Redis here: nothing to replay, and the tests that need one say so
    finally:
        client.close()


@pytest.fixture
def live_channel():  # type: ignore[no-untyped-def]
    """The real Redis behind the live channel, emptied of this test's streams afterwards."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.ping()
    yield client
    for key in client.scan_iter("appliance:deployment:*"):
        client.delete(key)


# ------------------------------------------------------------ several workers (pytest-xdist)
# `pytest -n N` runs tests side by side in N worker processes. Each worker has a database of
# its own (pytest-django names it test_<name>_gw<i>; tests/servers.py hands that name to the
# panel, worker and agent processes a test starts) and a Redis db of its own (the tests flush
# it): worker i uses the run's Redis db + i, set in the worker's environment before it starts,
# so Django's settings and every process the worker starts read it. Docker names carry
# TEST_SESSION (tests/conftest_docker.py), drawn anew in each worker. Tests that share a fixed
# Docker name, image tag or an expensive module fixture are put on one worker with
# @pytest.mark.xdist_group (the run uses --dist loadgroup); a test that restarts a service
# every test uses (PostgreSQL, dockerd), or measures timings that another test's CPU use would
# skew, is marked `exclusive`: no other worker runs a test while it runs.

EXCLUSIVE_WAIT_S = 3600  # the longest test (a compose build) fits well inside
_LOCKS_ENV = "APPLIANCE_TEST_LOCKS"  # the run's lock folder, made by the controller
_LOCKS = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") == "loadgroup":
        # The scheduler keeps the collection's order (longest_first), not its own by the
        # number of tests in each group.
        config.option.loadscopereorder = False
    config.addinivalue_line(
        "markers", "exclusive: restarts a service every test uses (PostgreSQL, dockerd), or "
        "measures timings that other tests' CPU use skews; under pytest-xdist no other "
        "worker runs a test meanwhile")


def worker_redis_url(url: str, worker: int) -> str:
    """The run's Redis URL with its db number moved on by the worker's index."""
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{base + worker}"))


# The e2e modules that bring up a whole compose project (the panel's images built, the
# trial's two simulated hosts each with a Docker engine of its own): one project at a time
# on a 2-core machine, so their bounds (a request's wait, an idle trial's CPU) hold; the
# other e2e tests (a browser on processes of the test's own) run beside them.
COMPOSE_MODULES = frozenset({
    "tests/e2e/test_compose.py", "tests/e2e/test_data_plane.py",
    "tests/e2e/test_fleet_trial.py", "tests/e2e/test_fleet_faults.py",
})
# The run's `exclusive` tests are one group, run first: the run waits once for the other
# workers' tests to end (each waits up to a whole compose test), not once per exclusive test.
EXCLUSIVE_GROUP = "exclusive"
# Seconds each test module took in a whole run (python -m tests.durations REPORT writes it
# from var/test-report.xml): a --dist loadgroup run hands out the longest groups and modules
# first, so no worker is left with a long one at the end while the others idle.
DURATIONS = Path(__file__).with_name("durations.json")


@pytest.hookimpl(wrapper=True)  # the groups before the other plugins' hooks, the order after
def pytest_collection_modifyitems(
        config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """The groups no test names itself: the tests on simulated hosts (tests/fleet/simhosts.py:
    each host a Docker engine of its own, the heaviest waits there are) on one worker; the
    compose tests (COMPOSE_MODULES) on one worker and the browser tests (the rest of
    tests/e2e) on one worker, apart from the rest; a module with a module-scoped fixture (a
    stack, a build, engines) on one worker, so the fixture is made once, not once per worker;
    every exclusive test in one group, whatever its module's. Under --dist loadgroup the
    items are ordered that group first, then the longest (DURATIONS) first."""
    loadgroup = getattr(config.option, "loadgroup", False)  # a worker of a loadgroup run
    for item in items:
        _group_by_default(item)
        if loadgroup:
            _mark_group_in_nodeid(item)
    yield  # pytest-django's order (by database use) within each unit is kept
    if loadgroup:
        items[:] = longest_first(items, _module_seconds())


def _group_by_default(item: pytest.Item) -> None:
    # An exclusive test's group is EXCLUSIVE_GROUP, whatever it names (_group_of).
    if not _is_exclusive(item) and not item.get_closest_marker("xdist_group"):
        module = vars(getattr(item, "module", None) or pytest).values()
        if any(getattr(value, "__module__", None) == "tests.fleet.simhosts" for value in module):
            item.add_marker(pytest.mark.xdist_group("simhosts"))
        elif item.nodeid.split("::")[0] in COMPOSE_MODULES:
            item.add_marker(pytest.mark.xdist_group("compose"))
        elif item.nodeid.startswith("tests/e2e/"):
            item.add_marker(pytest.mark.xdist_group("e2e"))
        elif (info := getattr(item, "_fixtureinfo", None)) and any(
                fixture.scope == "module"
                for fixtures in info.name2fixturedefs.values() for fixture in fixtures):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def _mark_group_in_nodeid(item: pytest.Item) -> None:
    """pytest-xdist's scheduler reads a test's group from a `@group` suffix of its node id,
    which pytest-xdist 3.8 writes to `item._nodeid`: pytest 9 no longer reads that (the id
    is `item._id`), so without this every group is silently spread over all workers."""
    names = [_group_of(item)] if _group_of(item) else []
    ident = getattr(item, "_id", None)
    if names and ident is not None and "@" not in item.nodeid.rsplit("]", 1)[-1]:
        item._id = type(ident).parse(f"{item.nodeid}@{'_'.join(names)}")


def _group_of(item: pytest.Item) -> str:
    """The item's xdist group: an exclusive test's is EXCLUSIVE_GROUP alone."""
    if _is_exclusive(item):
        return EXCLUSIVE_GROUP
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    return "_".join(names)


def _module_seconds() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no record: the collection's own order


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """The items by unit (the xdist group, or the module of a test in none), the exclusive
    group first, then the units by their expected seconds, longest first; a unit's items
    keep their order, and a module's tests in no group stay together. A unit's seconds are
    its tests' share of their modules' (a module unknown to `seconds` counts 0)."""
    count: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        count[module] = count.get(module, 0) + 1
    units: dict[str, list[pytest.Item]] = {}
    weight: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        unit = _group_of(item) or module
        units.setdefault(unit, []).append(item)
        weight[unit] = weight.get(unit, 0.0) + seconds.get(module, 0.0) / count[module]
    order = sorted(units, key=lambda unit: (unit != EXCLUSIVE_GROUP, -weight[unit]))
    return [item for unit in order for item in units[unit]]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list) -> None:  # type: ignore[type-arg]
    # Runs in the controller, before any worker process exists: spec.env is set in the
    # worker's environment before its pytest (and so Django's settings) starts.
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        available = int(client.config_get("databases")["databases"])
    except (redis.RedisError, KeyError, ValueError):
        available = 16  # redis-server's default
    finally:
        client.close()
    for spec in specs:
        index = int(str(spec.id).removeprefix("gw"))
        url = worker_redis_url(settings.REDIS_URL, index)
        if int(urlsplit(url).path.strip("/")) >= available:
            raise pytest.UsageError(
                f"{len(specs)} workers on Redis db {urlsplit(settings.REDIS_URL).path} need dbs "
                f"up to {urlsplit(url).path.strip('/')}, and this Redis has {available}: use "
                "fewer workers (-n) or a lower db in APPLIANCE_REDIS_URL")
        spec.env["APPLIANCE_REDIS_URL"] = url
    locks = config.stash.setdefault(_LOCKS, Path(tempfile.mkdtemp(prefix="appliance-pytest-")))
    for spec in specs:
        spec.env[_LOCKS_ENV] = str(locks)


def _flock(handle: object, mode: int, what: str, deadline: float) -> None:
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)  # type: ignore[arg-type]
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"waited {EXCLUSIVE_WAIT_S} s for {what}")
            time.sleep(0.1)


# The run's lock files of an exclusive test whose next test on this worker is exclusive too:
# kept held, so a run of exclusive tests (a parametrized one, a module of them) waits for the
# other workers' tests to end once, not once per test.
_HELD: list[tuple[IO[str], IO[str]]] = []


def _is_exclusive(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("exclusive") is not None


def _release(turnstile: IO[str], lock: IO[str]) -> None:
    for handle in (lock, turnstile):
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@contextlib.contextmanager
def _run_lock(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under pytest-xdist: an `exclusive` test holds the run's lock alone; every other test
    holds it shared. A waiting exclusive test holds the turnstile, so no new test starts
    before it (it cannot starve while the other workers keep taking turns). An exclusive
    test followed by another keeps both held for it."""
    folder = os.environ.get(_LOCKS_ENV)
    if not folder:
        yield
        return
    exclusive = _is_exclusive(item)
    keep = exclusive and _is_exclusive(nextitem)
    if _HELD and not exclusive:  # a guard: a lock is kept only for an exclusive next test
        _release(*_HELD.pop())
    if _HELD:
        turnstile, lock = _HELD.pop()
    else:
        deadline = time.monotonic() + EXCLUSIVE_WAIT_S
        turnstile = (Path(folder) / "turnstile").open("a")
        lock = (Path(folder) / "lock").open("a")
        try:
            _flock(turnstile, fcntl.LOCK_EX, "a test that runs alone to start", deadline)
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            _flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH,
                   "the other workers' tests to end" if exclusive
                   else "a test that runs alone to end", deadline)
        except BaseException:
            _release(turnstile, lock)
            raise
    try:
        yield
    finally:
        if keep:
            _HELD.append((turnstile, lock))
        else:
            _release(turnstile, lock)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    # Around setup, call and teardown: a module fixture set up or torn down at this test
    # (a stack, a build) is inside the lock too.
    with _run_lock(item, nextitem):
        return (yield)


# The work tree guard (tests/worktree.py): under CI, a run that changed a tracked file fails.
# With several workers the controller checks, once, after every worker has ended.
_WORKTREE = pytest.StashKey[dict[str, str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if worktree_check_enabled() and not hasattr(session.config, "workerinput"):
        session.config.stash[_WORKTREE] = worktree_snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    locks = session.config.stash.get(_LOCKS, None)
    if locks is not None:  # the controller, after every worker has ended
        shutil.rmtree(locks, ignore_errors=True)
    before = session.config.stash.get(_WORKTREE, None)
    if before is None:
        return
    changed = worktree_changes(before=before, after=worktree_snapshot())
    if changed:
        session.config.get_terminal_writer().line(
            "The test run changed tracked files (tests write under artifacts/ or tmp_path): "
            + ", ".join(changed), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
