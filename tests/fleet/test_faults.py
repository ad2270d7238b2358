"""Three joined hosts ship their engines' logs, steps and metrics to a panel server process
(uvicorn, as compose runs `web`) while the panel's Redis restarts, then its PostgreSQL:
every line each engine printed is stored once and in order, each event log is gap-free,
each host's agent is still running and each host `ready`, each engine still `ready`.

The hosts' agents run as threads of this process (appliance.runtime.remote_agent, each
joined with its own token and holding its own credential, as tests/fleet/test_remote_agent.py
runs one); the engines are the test engine on this machine's Docker, each published on the
bridge's address, decoding steadily (TEST_ENGINE_TRAFFIC) with a decode line every 4 steps."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.container_plan import Identity
from appliance.runtime.containers import EngineRuntime
from appliance.runtime.host_sink import MASK
from appliance.runtime.panel_link import panel_link_open
from appliance.runtime.remote_agent import RemoteAgent, host_report
from tests.conftest_docker import (  # noqa: F401
    docker_client,
    remove_engines,
    test_engine_image,
)
from tests.conftest_docker import wait_for as until
from tests.fleet.simhosts import gateway
from tests.loglines import assert_every_line_once, stored_lines
from tests.servers import PG_DATA, free_port, panel_server, pg_ctl, redis_server, redis_shutdown
from tests.specs import spec
from tests.waiting import wait_for_status
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus, MetricPoint
from web.deployments.services.installation import instance_id
from web.fleet import heartbeat, services
from web.fleet.models import FleetHost
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker,
              pytest.mark.xdist_group("faults")]
S = DeploymentStatus
HOSTS = ("gpu-a", "gpu-b", "gpu-c")
CHATTY = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "4", "TEST_ENGINE_TRAFFIC": "2"}


@pytest.fixture
def panel(tmp_path: Path, test_engine_image: str) -> Iterator[tuple[str, int]]:  # noqa: F811
    """The panel's server process on a Redis of this test's own (restarted below), with
    the simulator for its configured engine image, as the hosts' placements send it."""
    port = free_port()
    with redis_server(tmp_path, port), panel_server(
            tmp_path / "web.log", APPLIANCE_REDIS_URL=f"redis://127.0.0.1:{port}/0",
            APPLIANCE_ENGINE_IMAGE=test_engine_image,
            APPLIANCE_ENGINE_GPU_REQUESTS="0") as url:
        yield url, port


@pytest.fixture
def hosts(panel: tuple[str, int], tmp_path: Path, docker_client: Any,  # noqa: F811
          test_engine_image: str) -> Iterator[list[threading.Thread]]:  # noqa: F811
    url, _ = panel
    stop = threading.Event()
    threads = []
    for name in HOSTS:
        config = RemoteSettings(
            panel_url=url, host_name=name, advertise_addr=gateway(docker_client.networks.get(
                "bridge")), join_token=services.jointoken_create(host_name=name).secret,
            credential_path=tmp_path / name / "credential", gpu_requests=False,
            gpu_check=False, extra_env=CHATTY, stop_timeout_s=5, ready_timeout_s=90,
            tick_s=0.5)
        runtime = EngineRuntime()
        link = panel_link_open(panel_url=url, credential_path=config.credential_path,
                               token=config.join_token, name=name,
                               report=host_report(runtime, config))
        agent = RemoteAgent(link=link, config=config, runtime=runtime)
        threads.append(threading.Thread(target=agent.run, args=(stop,), daemon=True,
                                        name=f"host-{name}"))
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False):
        for thread in threads:
            thread.start()
        yield threads
        stop.set()
        for thread in threads:
            thread.join(timeout=20)
    remove_engines(instance_id())


def _placed(i: int, host: str) -> int:
    made = deploying.deployment_create(data=spec(name=f"chatty-{i}", gpus=[i],
                                                   engine__decode_log_interval=4),
                                       confirm_warnings=True)
    services.placement_assign(deployment=made, host_name=host, reason="named in the test")
    tasks.deploy.apply(args=[made.pk]).get()
    return made.pk


def _ready(pks: list[int], timeout_s: float = 120) -> None:
    for pk in pks:
        assert wait_for_status(pk, {S.READY, S.FAILED}, timeout_s) == S.READY, pk


_KEY = re.compile(r"api_key='[0-9a-f]{64}'")


def _engine_own(lines: list[str]) -> list[str]:
    """The engine's own lines as a fleet host ships them: its start's key masked (the host
    knows it; tests/fleet/test_remote_agent.py checks the mask itself), the host's own notes
    (`appliance: ...`, which the engine's entrypoint prints too) left out on both sides."""
    return [_KEY.sub(f"api_key='{MASK}'", line) for line in lines
            if not line.startswith("appliance: ")]


@pytest.mark.skipif(not Path(PG_DATA).exists() or os.geteuid() != 0,
                    reason="needs the test script's own PostgreSQL server")
@pytest.mark.exclusive  # every worker's database goes down with the server
def test_three_hosts_lose_and_double_no_line_while_redis_and_postgresql_restart(
        panel: tuple[str, int], hosts: list[threading.Thread], tmp_path: Path,
        docker_client: Any) -> None:  # noqa: F811
    url, port = panel
    pks = [_placed(i, host) for i, host in enumerate(HOSTS)]
    _ready(pks)
    time.sleep(3)  # decoding: lines, metric points, heartbeats from all three

    redis_shutdown(port)  # the panel's live channel and Celery broker away for 5 s
    time.sleep(5)
    with redis_server(tmp_path, port):
        time.sleep(3)
        connection.close()
        pg_ctl("restart", "-m", "fast", "-w")  # the hosts' ingest, steps and heartbeats fail
        connection.close()
        connection.close_pool()  # this process's pool, made anew (see tests/worker/test_faults)
        time.sleep(8)  # the hosts' retries and the followers' restarts from the cursor

        assert all(thread.is_alive() for thread in hosts), "every host's agent still runs"
        _ready(pks, 30)
        until(lambda: [heartbeat.host_state(host=h, now=timezone.now())
                       for h in FleetHost.objects.joined()] == ["ready"] * 3,
              timeout_s=30, every_s=0.5)
        since = time.time()
        for pk in pks:
            # Paused, the engine prints no more (its traffic would keep it printing): what
            # it printed is all there is to find stored. (A stop would remove the container
            # and its log with it.)
            row = Deployment.objects.get(pk=pk)
            engine = docker_client.containers.get(
                Identity(str(pk), instance_id(), row.start_token).name)
            engine.pause()
            try:
                assert_every_line_once(pk, settle_s=20, printed_as=_engine_own,
                                       stored_as=_engine_own)
            finally:
                engine.unpause()
            decoding = [t for t in stored_lines(pk) if "Decode batch" in t]
            assert len(decoding) > 20, (pk, len(decoding))  # the outages fell among them
        # Every host's monitor stored points after both restarts.
        after = MetricPoint.objects.filter(deployment_id__in=pks,
                                           ts__gte=datetime.fromtimestamp(since - 10, tz=UTC))
        assert set(after.values_list("deployment_id", flat=True)) == set(pks)
