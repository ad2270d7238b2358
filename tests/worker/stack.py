"""The set-up the worker tests on the production road share (test_tune.py, test_rolling.py):
the panel, the Celery worker, the own host's agent and the panel loop as processes on the
test database and Redis, the test engine in Docker at a fast pace, and a bounded wait on a condition."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.test import override_settings

from tests.conftest_docker import remove_engines
from tests.servers import celery_worker, own_host_agent, panel_loop, panel_server
from web.deployments.services.installation import instance_id


@contextlib.contextmanager
def fast_engines(image: str, fast: dict[str, str]) -> Iterator[dict[str, str]]:
    """This process's settings and the worker's and agent's environment for the test engine
    `image` at `fast`'s pace (TEST_ENGINE_* values), no GPU asked for; every engine of this
    install removed afterwards."""
    extra = ",".join(f"{k}={v}" for k, v in fast.items())
    try:
        with override_settings(ENGINE_IMAGE=image, ENGINE_GPU_REQUESTS=False,
                               ENGINE_EXTRA_ENV=fast, ENGINE_STOP_TIMEOUT_S=5):
            yield {"APPLIANCE_ENGINE_IMAGE": image,
                   "APPLIANCE_ENGINE_GPU_REQUESTS": "0", "APPLIANCE_ENGINE_EXTRA_ENV": extra,
                   "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
                   "APPLIANCE_ENGINE_READY_TIMEOUT_S": "90",
                   "APPLIANCE_ENGINE_TEST_ENV": "1", "APPLIANCE_AGENT_TICK_MS": "250",
                   "APPLIANCE_LOOP_TICK_MS": "250"}
    finally:
        remove_engines(instance_id())


Process = subprocess.Popen[bytes]


@contextlib.contextmanager
def worker_agent_loop(tmp_path: Path, env: dict[str, str], agent_log: str = "agent.log",
                      loop_log: str = "loop.log") -> Iterator[tuple[Process, Process, Process, str]]:
    """The panel (web.log, the host API its host's agent talks to), the Celery worker
    (worker.log), the panel's own host's agent (`agent_log`: the fleet's agent program,
    tests/servers.py own_host_agent) and the panel loop (`loop_log`, which steps rolling
    changes and sweeps Tunes) under tmp_path; yields the worker, agent and loop processes and
    the panel's URL (a successor agent's)."""
    with panel_server(tmp_path / "web.log", **env) as url, \
            panel_loop(tmp_path / loop_log, **env) as loop, \
            own_host_agent(tmp_path / agent_log, url, tmp_path, **env) as agent, \
            celery_worker(tmp_path / "worker.log", **env) as worker:
        yield worker, agent, loop, url


def until(check: Callable[[], Any], what: Any, timeout_s: float, poll_s: float) -> Any:
    """`check()`'s first true answer, asked every poll_s; fails after timeout_s with `what`:
    the wait in words, or a function that says it with what is known then."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(poll_s)
    return found
