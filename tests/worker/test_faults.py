"""Faults survived with nothing lost: real processes (the own host's agent, the panel, its
loop, Celery worker, redis-server, PostgreSQL, dockerd) killed and restarted around real
engine containers. The agent is the fleet's agent program, as compose runs it on the
panel's own host: it writes through the panel's host API only.

Every case checks the same three things: the deployment carries on (or ends as it
should), there is one engine container, and every line the container printed is stored
exactly once and in order (compared with Docker's own log of the container).
docs/reliability.md has the table of these cases and their outcomes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings
from django.db import connection
from django.test import override_settings

import docker
from tests.conftest_docker import engines_of, remove_engines
from tests.loglines import assert_every_line_once
from tests.servers import (
    celery_worker,
    free_port,
    login_session,
    own_host_agent,
    panel_loop,
    panel_server,
    pg_ctl,
    redis_server,
)
from tests.specs import spec
from tests.waiting import wait_for_status
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from web.fleet.models import FleetHost
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker,
              pytest.mark.xdist_group("faults")]
S = DeploymentStatus
SLOW = {"TEST_ENGINE_PACE_S": "0.15", "TEST_ENGINE_SHARDS": "16"}


@pytest.fixture
def engine_env(test_engine_image: str) -> Iterator[dict[str, str]]:  # noqa: F811
    """The settings a GPU-less host running the test engine has, for this process and the
    agent and worker processes the tests start."""
    extra = ",".join(f"{k}={v}" for k, v in SLOW.items())
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": extra, "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
           "APPLIANCE_ENGINE_READY_TIMEOUT_S": "120"}
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=SLOW, ENGINE_STOP_TIMEOUT_S=5):
        yield env
    remove_engines(instance_id())  # this database's engines only, never another run's


def _deployment(**changes: Any) -> Deployment:
    return deploying.deployment_create(data=spec(**changes), confirm_warnings=True)


def _wait(pk: int, statuses: set[str], timeout_s: float = 60) -> str:
    status = wait_for_status(pk, statuses, timeout_s)
    assert status in statuses, f"deployment {pk} is {status}, not {statuses}"
    return status


def _engines(pk: int) -> list[Any]:
    return engines_of(instance_id(), pk)


# ---------------------------------------------------------------- the engine agent


# Replaced and carrying on within 10 s is a timing bound: other workers' CPU would skew it.
@pytest.mark.exclusive
@pytest.mark.parametrize("phase", ["starting", "checking", "loading", "capturing", "ready",
                                   "stopping"])
def test_an_agent_killed_in_any_phase_is_replaced_and_no_line_is_lost_or_doubled(
        engine_env: dict[str, str], tmp_path: Path, phase: str) -> None:
    deployment = _deployment()
    pk = deployment.pk
    tasks.deploy.apply(args=[pk]).get()
    with panel_server(tmp_path / "web.log", **engine_env) as url:
        with own_host_agent(tmp_path / "agent-1.log", url, tmp_path, **engine_env) as first:
            if phase == "stopping":
                _wait(pk, {S.READY}, 90)
                services.deployment_stop(deployment_id=pk)
            else:
                _wait(pk, {phase}, 90)
            first.send_signal(signal.SIGKILL)
            first.wait()
        restarted = time.monotonic()
        # The same host's agent restarted on its state: its session is its own again.
        with own_host_agent(tmp_path / "agent-2.log", url, tmp_path, **engine_env):
            _carries_on(pk, phase, restarted)


def _carries_on(pk: int, phase: str, restarted: float) -> None:
    if phase == "stopping":
        _wait(pk, {S.STOPPED}, 30)
        assert time.monotonic() - restarted < 10
        assert not _engines(pk)
        return
    after = _next_status(phase)
    _wait(pk, {after, S.READY}, 10 + 60)
    assert _seconds_to_progress(pk, restarted) < 10, "it carries on within 10 s"
    _wait(pk, {S.READY}, 90)
    assert len(_engines(pk)) == 1, "one engine container, adopted"
    assert_every_line_once(pk, printed_as=_engine_own, stored_as=_engine_own)


def _engine_own(lines: list[str]) -> list[str]:
    """The engine's lines as its host's agent ships them: the agent's own notes out."""
    return [line for line in lines if not line.startswith("appliance: ")]


def _next_status(phase: str) -> str:
    order = ["starting", "checking", "loading", "capturing", "ready"]
    return order[min(order.index(phase) + 1, len(order) - 1)]


def _seconds_to_progress(pk: int, since: float) -> float:
    """Seconds from `since` (monotonic) to the first event stored after it."""
    newest = Deployment.objects.get(pk=pk).events.order_by("-seq").first()
    assert newest is not None
    age = time.time() - newest.ts.timestamp()
    return max(0.0, (time.monotonic() - since) - age)


def test_a_new_agent_takes_over_an_engine_only_when_the_old_lease_has_expired(
        engine_env: dict[str, str], tmp_path: Path) -> None:
    deployment = _deployment()
    pk = deployment.pk
    tasks.deploy.apply(args=[pk]).get()
    with panel_server(tmp_path / "web.log", **engine_env) as url:
        with own_host_agent(tmp_path / "a.log", url, tmp_path / "a", **engine_env) as a:
            _wait(pk, {S.LOADING}, 60)
            held = FleetHost.objects.get(name=settings.HOST_NAME).agent_session
            a.send_signal(signal.SIGKILL)
            a.wait()
        killed = time.monotonic()
        # Another agent process of the host, with a state of its own (the credential copied,
        # not the stored session): it waits for a's lease.
        (tmp_path / "b").mkdir()
        shutil.copy(tmp_path / "a" / "host-credential", tmp_path / "b" / "host-credential")
        with own_host_agent(tmp_path / "b.log", url, tmp_path / "b", **engine_env):
            _wait(pk, {S.READY}, 120)
            taken = FleetHost.objects.get(name=settings.HOST_NAME).agent_session
            assert taken and held and taken != held
            # The 15 s lease is renewed once less than two thirds of it (10 s) is left,
            # looked at each 1 s tick: at the kill it had at least 9 s to run.
            assert time.monotonic() - killed >= 9, "not before the 15 s lease ran out"
            assert len(_engines(pk)) == 1
            assert_every_line_once(pk, printed_as=_engine_own, stored_as=_engine_own)


def _shown_status(client: Any, pk: int) -> str:
    rows = client.get("/deployments/rows/").json()["deployments"]
    return str(next(r["status"] for r in rows if r["id"] == pk))


def _until_shown(client: Any, pk: int, status: str, timeout_s: float) -> float:
    started = time.monotonic()
    while _shown_status(client, pk) != status:
        assert time.monotonic() - started < timeout_s, f"deployment {pk} never shown {status}"
        time.sleep(0.5)
    return time.monotonic() - started


def test_a_silent_agent_turns_its_deployment_unknown_and_back_when_it_returns(
        engine_env: dict[str, str], tmp_path: Path, admin: Any) -> None:
    from django.test import Client

    client = Client()
    client.force_login(admin)
    pk = _deployment().pk
    tasks.deploy.apply(args=[pk]).get()
    env = {**engine_env, "APPLIANCE_FLEET_HEARTBEAT_S": "1"}  # the panel's: every second
    with override_settings(AGENT_SILENT_S=3), panel_server(tmp_path / "web.log", **env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env) as agent:
        _wait(pk, {S.READY}, 90)
        assert _shown_status(client, pk) == "ready"
        agent.send_signal(signal.SIGSTOP)  # alive, but it says nothing: a hung agent
        try:
            # Its heartbeat comes every second: unknown after the 3 s of silence.
            assert 1.5 <= _until_shown(client, pk, "unknown", 10) < 10
            polled = client.get(f"/deployments/{pk}/agent/").json()
            assert polled["status"] == "ready"
            assert polled["silence"]["agent_id"] == f"agent@{settings.HOST_NAME}"
        finally:
            agent.send_signal(signal.SIGCONT)
        assert _until_shown(client, pk, "ready", 5) < 5
        assert client.get(f"/deployments/{pk}/agent/").json()["silence"] is None


# ---------------------------------------------------------------- the Celery worker


def test_a_worker_killed_while_building_is_replaced_and_the_build_carries_on(
        engine_env: dict[str, str], tmp_path: Path) -> None:
    from tests.site_recipes import engine_source_repo, write_recipe

    recipes = tmp_path / "recipes"
    write_recipe(recipes, "site-fault", engine_source_repo(tmp_path))
    env = {**engine_env, "APPLIANCE_ENGINE_IMAGE": "", "APPLIANCE_RECIPES_DIR": str(recipes),
           "APPLIANCE_ENGINE_GPU_CHECK": "0"}
    data = spec(name="built-fault", recipe="site-fault", self_check=False)
    data["engine"] = {"model_path": "/models/test", "tp_size": 1,
                      "speculative_algorithm": "NONE"}
    # The panel loop queues the build again once the killed worker's lease runs out.
    with override_settings(RECIPES_DIR=str(recipes)), \
            panel_server(tmp_path / "web.log", **env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env), \
            panel_loop(tmp_path / "loop.log", **env):
        with celery_worker(tmp_path / "worker-1.log", **env) as first:
            pk = deploying.deployment_create(data=data, confirm_warnings=True,
                                             rebuild_image=True).pk
            _wait(pk, {S.BUILDING}, 60)
            _wait_event(pk, "build_step", 60)
            first.send_signal(signal.SIGKILL)
            first.wait()
        with celery_worker(tmp_path / "worker-2.log", **env):
            _wait(pk, {S.READY}, 180)
        assert len(_engines(pk)) == 1
        assert_every_line_once(pk, printed_as=_engine_own, stored_as=_engine_own)
    client = docker.from_env()
    for container in _engines(pk):
        container.remove(force=True)
    for image in client.images.list(filters={"label": "appliance.recipe=site-fault"}):
        # noprune: the untagged layers under it are other builds' cache, maybe in use now
        client.images.remove(image.id, force=True, noprune=True)


def _wait_event(pk: int, build_kind: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not Deployment.objects.get(pk=pk).events.filter(
            kind="build", payload__kind=build_kind).exists():
        assert time.monotonic() < deadline, f"no {build_kind} event"
        time.sleep(0.2)


def test_a_stop_is_carried_out_within_3_s_behind_a_backlog_of_50_queued_deployments(
        engine_env: dict[str, str], tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 64  # a host with a GPU for each queued deployment (GPU leases)
    ready = _deployment(name="serving")
    tasks.deploy.apply(args=[ready.pk]).get()
    with panel_server(tmp_path / "web.log", **engine_env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, APPLIANCE_GPU_COUNT="64",
                           **engine_env):
        _wait(ready.pk, {S.READY}, 90)
        for i in range(50):  # queued for a worker that is busy elsewhere (none runs here)
            _deployment(name=f"backlog-{i}", gpus=[i + 1])
        asked = time.monotonic()
        services.deployment_stop(deployment_id=ready.pk)
        _wait(ready.pk, {S.STOPPED}, 10)
        took = time.monotonic() - asked
    assert took < 3, f"the stop took {took:.1f} s"
    assert not _engines(ready.pk)


# ---------------------------------------------------------------- Redis, PostgreSQL, dockerd


def test_a_redis_restart_keeps_the_worker_and_agent_up_and_loses_no_queued_task(
        engine_env: dict[str, str], tmp_path: Path, operator: Any) -> None:
    from celery import Celery

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    env = {**engine_env, "APPLIANCE_REDIS_URL": url}
    broker = Celery(broker=url)

    def queue_deploy(pk: int) -> None:  # what deployment_create enqueues, on this broker
        broker.send_task("worker.tasks.deploy", args=[pk], queue="builds")

    with redis_server(tmp_path, port):
        # A task queued while no worker runs survives a Redis restart (append-only file).
        waiting = _deployment(name="queued-across-restart")
        queue_deploy(waiting.pk)
        subprocess.run(["redis-cli", "-p", str(port), "shutdown"], check=False,
                       capture_output=True)
    with redis_server(tmp_path, port), \
            celery_worker(tmp_path / "worker.log", **env) as worker, \
            panel_server(tmp_path / "web.log", **env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env) as agent:
        _wait(waiting.pk, {S.READY}, 120)
        viewer = _SseViewer(url, waiting.pk)  # a browser watching across the restart
        subprocess.run(["redis-cli", "-p", str(port), "shutdown"], check=False,
                       capture_output=True)
        time.sleep(9)  # Redis is away for 9 s, as in the report
        with redis_server(tmp_path, port):
            time.sleep(2)
            assert worker.poll() is None, "the worker survived the Redis restart"
            assert agent.poll() is None, "the agent survived the Redis restart"
            after = _deployment(name="queued-after-restart", gpus=[1])  # GPU 0: "waiting"
            queue_deploy(after.pk)
            _wait(after.pk, {S.READY}, 120)
            services.deployment_stop(deployment_id=waiting.pk)
            _wait(waiting.pk, {S.STOPPED}, 30)
            assert_every_line_once(after.pk, printed_as=_engine_own, stored_as=_engine_own)
            viewer.join(timeout=30)
            end = Deployment.objects.get(pk=waiting.pk).events.get(kind="end").seq
            assert viewer.seqs == list(range(1, end + 1)), \
                "the SSE client resumed across the restart with nothing missing or doubled"


class _SseViewer(threading.Thread):
    """An SSE client of the panel that reconnects with Last-Event-ID, as a browser does."""

    def __init__(self, url: str, pk: int) -> None:
        super().__init__(daemon=True)
        self.url, self.pk, self.seqs = url, pk, []  # type: ignore[var-annotated]
        self.session = login_session(url, "otto", "operator-pass-1")
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            headers = {"Last-Event-ID": str(self.seqs[-1])} if self.seqs else {}
            try:
                with self.session.get(f"{self.url}/deployments/{self.pk}/events/stream/",
                                      headers=headers, stream=True, timeout=30) as resp:
                    for raw in resp.iter_lines(decode_unicode=True):
                        if raw.startswith("data: "):
                            event = json.loads(raw[6:])
                            if "seq" not in event:
                                continue  # a live metric point: no id, never replayed
                            self.seqs.append(event["seq"])
                            if event["kind"] == "end":
                                return
            except requests.RequestException:
                time.sleep(1)


@pytest.mark.skipif(not Path("/var/lib/appliance-test/pgdata").exists() or os.geteuid() != 0,
                    reason="needs the test script's own PostgreSQL server")
@pytest.mark.exclusive  # every worker's database goes down with the server
def test_a_postgresql_restart_is_retried_and_no_event_is_written_twice(
        engine_env: dict[str, str], tmp_path: Path) -> None:
    deployment = _deployment()
    pk = deployment.pk
    tasks.deploy.apply(args=[pk]).get()
    with panel_server(tmp_path / "web.log", **engine_env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **engine_env) as agent:
        _wait(pk, {S.LOADING}, 60)
        connection.close()
        pg_ctl("restart", "-m", "fast", "-w")
        # This test's own pool is made anew: it may sit in the reconnect backoff it entered
        # while the server was down (CI saw "couldn't get a connection after 10.00 sec").
        connection.close()
        connection.close_pool()
        _wait(pk, {S.READY}, 120)
        assert agent.poll() is None
        assert len(_engines(pk)) == 1
        assert_every_line_once(pk, printed_as=_engine_own, stored_as=_engine_own)


@pytest.mark.skipif(shutil.which("dockerd") is None or os.geteuid() != 0,
                    reason="needs a dockerd this test may restart")
@pytest.mark.exclusive  # every worker's Docker calls fail while dockerd restarts
def test_a_dockerd_restart_marks_nothing_failed_and_following_resumes(
        engine_env: dict[str, str], tmp_path: Path) -> None:
    client = docker.from_env()
    if not client.info().get("LiveRestoreEnabled"):
        pytest.skip("dockerd runs without --live-restore (tests/setup-and-run.sh enables it)")
    deployment = _deployment()
    pk = deployment.pk
    tasks.deploy.apply(args=[pk]).get()
    with panel_server(tmp_path / "web.log", **engine_env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **engine_env) as agent:
        _wait(pk, {S.LOADING}, 60)
        _restart_dockerd(tmp_path)
        _wait(pk, {S.READY}, 120)
        assert agent.poll() is None
        assert len(_engines(pk)) == 1
        assert_every_line_once(pk, printed_as=_engine_own, stored_as=_engine_own)


def _restart_dockerd(tmp_path: Path) -> None:
    pid = int(Path("/var/run/docker.pid").read_text())
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    log = (tmp_path / "dockerd.log").open("w")
    subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(100):
        if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError("dockerd did not come back")
