"""The real stack the browser tests drive: a Celery worker, the engine agent and the uvicorn
panel as processes, over a flushed Redis; and logging in as the operator."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection
from playwright.sync_api import Page, expect

from tests.conftest_docker import remove_engines
from tests.servers import celery_worker, own_host_agent, panel_server
from web.deployments.services.installation import instance_id


@contextlib.contextmanager
def appliance_stack(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """The panel, the worker and the panel's own host's agent (the fleet's agent program,
    tests/servers.py own_host_agent) with `env`; yields the panel's URL, then removes every engine
    container the test started: this install's alone (its instance id), so the engines of a
    compose run or of another database's tests beside it are left alone."""
    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # no stale tasks from other tests
    mine = instance_id()
    with panel_server(tmp_path / "web.log", **env) as url, \
            celery_worker(tmp_path / "worker.log", **env), \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env):
        yield url
    remove_engines(mine)


def login(page: Page, url: str, username: str = "otto",
          password: str = "operator-pass-1") -> None:  # noqa: S107 (the test operator's)
    page.goto(f"{url}/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login")
    expect(page.locator("h1")).to_have_text("Deployments")


def meanwhile(change: Callable[[], object]) -> None:
    """Write rows from another thread (its own connection, closed after): Playwright's loop
    makes the ORM refuse in the test's thread. Waits for it at most 30 s."""
    def run() -> None:
        try:
            change()
        finally:
            connection.close()
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
