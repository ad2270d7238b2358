"""Shared fixtures: named actors, a clean live channel."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

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


@pytest.fixture
def live_channel():  # type: ignore[no-untyped-def]
    """The real Redis behind the live channel, emptied of this test's streams afterwards."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.ping()
    yield client
    for key in client.scan_iter("appliance:deployment:*"):
        client.delete(key)


# The work tree guard (tests/worktree.py): under CI, a run that changed a tracked file fails.
_WORKTREE = pytest.StashKey[dict[str, str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if worktree_check_enabled():
        session.config.stash[_WORKTREE] = worktree_snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_WORKTREE, None)
    if before is None:
        return
    changed = worktree_changes(before=before, after=worktree_snapshot())
    if changed:
        session.config.get_terminal_writer().line(
            "The test run changed tracked files (tests write under artifacts/ or tmp_path): "
            + ", ".join(changed), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
