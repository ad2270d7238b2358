"""The panel's own host run by the program every joined host runs (appliance.runtime.
remote_agent), joined with the token the panel loop keeps for it (web/fleet/tokenfiles.py),
against a live panel with the test engine on this machine's Docker: the host row its rows
were placed on is the one that joins, the panel builds nothing of its own but hands over
nothing either (its build worker gives the image), the agent runs the engine to ready and
stops it, the engine takes no key (the benchmark workers call own-host engines directly),
and a new deployment is still placed there as the panel's own host."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings
from django.test import override_settings

from appliance.runtime.agent_settings import RemoteSettings, join_token_read
from appliance.runtime.container_plan import Identity
from appliance.runtime.containers import EngineRuntime
from appliance.runtime.remote_agent import RemoteAgent
from tests.conftest_docker import docker_client, remove_engines, test_engine_image  # noqa: F401
from tests.fleet.hosts import remote_agent_running
from tests.servers import bridge_address, own_host_token
from tests.specs import spec
from tests.waiting import wait_for_status
from web.deploy import services as deploying
from web.deployments import services as deployments
from web.deployments.models import Deployment, DeploymentStatus, Event
from web.deployments.services.installation import instance_id
from web.fleet.models import FleetHost, Placement
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
FAST = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "4"}


@pytest.fixture
def own_agent(live_server, tmp_path: Path, docker_client, test_engine_image: str  # noqa: F811
              ) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The own host's agent, started once a deployment is already placed on the host."""
    own = str(settings.HOST_NAME)
    token_file = own_host_token(tmp_path)
    running = ExitStack()

    def config(extra_env: dict[str, str] | None = None) -> RemoteSettings:
        return RemoteSettings(
            panel_url=live_server.url, host_name=own,
            advertise_addr=bridge_address(),
            join_token=join_token_read(token_file, wait_s=5),
            credential_path=tmp_path / "host-credential", gpu_requests=False, gpu_count=8,
            gpu_check=False, extra_env=extra_env or FAST, stop_timeout_s=5,
            ready_timeout_s=90, tick_s=0.2)

    def start() -> RemoteAgent:
        agent, _ = running.enter_context(remote_agent_running(config()))
        return agent

    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False), running:
        yield {"start": start, "config": config, "token_file": token_file}
    remove_engines(instance_id())


def test_the_own_host_joins_with_the_loops_token_and_its_agent_runs_its_engines(own_agent) -> None:  # type: ignore[no-untyped-def]
    own = str(settings.HOST_NAME)
    made = deploying.deployment_create(data=spec(gpus=[0]), confirm_warnings=True)
    placed = Placement.objects.get(deployment=made)
    assert placed.host.name == own and not placed.host.is_joined
    own_agent["start"]()
    host = FleetHost.objects.get(name=own)
    assert host.is_joined and host.pk == placed.host_id, "the row it was placed on joined"
    assert Placement.objects.get(deployment=made).host_id == host.pk

    tasks.deploy.apply(args=[made.pk]).get()  # the panel's build worker: the image, no hand-over
    row = Deployment.objects.get(pk=made.pk)
    assert not row.events.filter(kind="build", payload__kind="handed_over").exists()
    assert wait_for_status(row.pk, {S.READY, S.FAILED}, 90) == S.READY
    row.refresh_from_db()
    assert row.agent_id == f"agent@{own}"
    # No key: the benchmark, check and Tune workers call an own-host engine directly.
    assert requests.get(f"{row.engine_url}/v1/models", timeout=5).status_code == 200
    assert Event.objects.filter(deployment=row, kind="log").exists(), "shipped via the ingest"

    # The next deployment still goes to the panel's own host, said so, now a joined row.
    second = deploying.deployment_create(data=spec(name="second", gpus=[1]),
                                         confirm_warnings=True)
    assert second.host == own and "this panel's host" in second.placement_reason

    deployments.deployment_stop(deployment_id=row.pk)
    assert wait_for_status(row.pk, {S.STOPPED, S.FAILED}, 30) == S.STOPPED
    row.refresh_from_db()
    assert EngineRuntime().find(Identity(str(row.pk), instance_id(), row.start_token)) is None


def test_an_upgrade_hands_a_serving_engine_from_the_hosts_agent_to_the_next(own_agent) -> None:  # type: ignore[no-untyped-def]
    """The own host's agent runs an engine to ready and stops, as an upgrade stops it (its
    engines keep running); the next agent program for the same host joins with its stored
    credential and adopts the running container: the same container, still ready, and every
    line it printed stored once, in order, across the hand-over."""
    import docker
    from appliance.runtime.follower import SCRAPE_ACCESS

    traffic = {**FAST, "TEST_ENGINE_TRAFFIC": "1", "TEST_ENGINE_DECODE_LOG_INTERVAL": "1",
               "TEST_ENGINE_TOKEN_S": "0.02"}
    with remote_agent_running(own_agent["config"](traffic)):
        made = deploying.deployment_create(data=spec(gpus=[0]), confirm_warnings=True)
        tasks.deploy.apply(args=[made.pk]).get()
        assert wait_for_status(made.pk, {S.READY, S.FAILED}, 90) == S.READY
        row = Deployment.objects.get(pk=made.pk)
        identity = Identity(str(row.pk), instance_id(), row.start_token)
        before = EngineRuntime().find(identity)
        assert before is not None
    # The upgrade: the old agent has stopped, given its lease back; its engine runs on.
    stored_before = Event.objects.filter(deployment=row, kind="log").count()
    before.reload()
    assert before.status == "running"

    own_agent["start"]()
    deadline = time.monotonic() + 30
    while Event.objects.filter(deployment=row, kind="log").count() < stored_before + 50:
        assert time.monotonic() < deadline, "the new agent ships the engine's new lines"
        time.sleep(0.5)
    row.refresh_from_db()
    assert row.status == S.READY and row.agent_id == f"agent@{settings.HOST_NAME}"
    after = EngineRuntime().find(identity)
    assert after is not None and after.id == before.id, "adopted, not started again"
    seqs = list(Event.objects.filter(deployment=row).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)), "a gap-free event log"
    # The agent's own notes ("appliance: engine container ... running") come as log
    # lines too; the engine never printed them.
    stored = [text for text in Event.objects.filter(deployment=row, kind="log").order_by("seq")
              .values_list("payload__text", flat=True) if not text.startswith("appliance: ")]
    raw = docker.from_env().containers.get(after.name).logs(stdout=True, stderr=True)
    printed = [line.rsplit("\r", 1)[-1] for line in raw.decode().split("\n") if line]
    printed = [line for line in printed if not SCRAPE_ACCESS.match(line)]
    assert stored == printed[:len(stored)], "every line printed is stored once, in order"
