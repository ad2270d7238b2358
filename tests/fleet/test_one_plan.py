"""Every host's agent plans an engine container one way (remote_plan) from the placement the
host API answers with. For the same spec the panel's own host and a joined host get the
same ContainerPlan but for where the engine is reached: on the engine network, nothing
published and no key, for the own host; published on the advertised address with the
start's key for a joined host, and no other field apart."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.container_plan import docker_run_kwargs
from appliance.runtime.remote_agent import SIMULATED_BUILD_ENV, remote_plan
from tests.fleet.hosts import joined
from tests.hostrows import host_reported
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from web.deployments.simulator import simulator_images_forget
from web.fleet import selectors, services
from web.fleet.models import FleetHost, Placement

pytestmark = pytest.mark.django_db
SIMULATOR = "appliance-test-engine:latest"
NETWORK = "appliance-engines-plan-test"
ADDR = "10.0.0.12"


def _host_settings(**changes: Any) -> RemoteSettings:
    """One host's agent settings, the same on both hosts but for `changes`."""
    return dataclasses.replace(RemoteSettings(
        panel_url="http://panel:8000", host_name="gpu-2", advertise_addr="",
        models_dir="/srv/models", secrets_dir="/run/secrets/test",
        extra_env={"TEST_ENGINE_TOKEN_S": "0.01"}, gpu_requests=True, gpu_check=True,
        shm_size="16g", pids_limit=4096, memory_limit="200g"), **changes)


def _answer(host: FleetHost) -> dict[str, Any]:
    [row] = selectors.host_placements(host=host)
    return dict(json.loads(json.dumps(row, cls=DjangoJSONEncoder)))


@pytest.fixture
def placed() -> tuple[Deployment, dict[str, Any], dict[str, Any]]:
    """A starting deployment on the simulator's image with a secret and two GPUs, and the
    host API's answer for it placed on the joined host gpu-2, then on the panel's own."""
    simulator_images_forget()
    host_reported(name="sim-a", agent_id="agent@sim-a", heartbeat_at=timezone.now(),
                  docker={"simulator_images": [SIMULATOR]})
    own = host_reported(name=settings.HOST_NAME)
    data = spec(name="one-plan", recipe="kimi-k2.6-ddtree", secrets=["HF_TOKEN"],
                gpus=[2, 3], engine__speculative_algorithm="DDTREE")
    deployment = Deployment.objects.create(
        name="one-plan", spec=data, recipe="kimi-k2.6-ddtree", algorithm="DDTREE",
        gpus=data["gpus"], status=DeploymentStatus.STARTING, image=SIMULATOR,
        start_token="start-1")
    host = joined("gpu-2").host
    services.placement_assign(deployment=deployment, host_name="gpu-2")
    on_joined = _answer(host)
    Placement.objects.filter(deployment=deployment).update(host=own)
    on_own = _answer(own)
    yield deployment, on_joined, on_own
    simulator_images_forget()


def test_the_own_host_on_its_network_and_a_joined_host_plan_alike(placed) -> None:  # type: ignore[no-untyped-def]
    deployment, on_joined, on_own = placed
    # The own host's answer carries no key: its engines are on the closed network only.
    assert on_own["engine_key"] == "" and on_joined["engine_key"]
    assert {k: v for k, v in on_own.items() if k != "engine_key"} == {
        k: v for k, v in on_joined.items() if k != "engine_key"}
    own = remote_plan(on_own, _host_settings(engine_network=NETWORK), instance_id())
    keyless = {k: v for k, v in on_joined.items() if k != "engine_key"}
    assert remote_plan(keyless, _host_settings(engine_network=NETWORK), instance_id()) == own
    assert own.network == NETWORK and own.api_key == ""
    assert "ports" not in docker_run_kwargs(own)
    # What the plan holds, so that the equality above compares something.
    assert own.env[SIMULATED_BUILD_ENV] == "433c58ed7"
    assert own.env["TEST_ENGINE_TOKEN_S"] == "0.01" and own.env["APPLIANCE_GPU_CHECK"] == "1"
    assert own.gpus == [2, 3] and own.secrets == ["HF_TOKEN"]
    assert own.secrets_dir == "/run/secrets/test" and own.volumes
    assert (own.shm_size, own.pids_limit, own.mem_limit) == ("16g", 4096, "200g")
    assert own.identity.start_token == "start-1" and own.instance_id == instance_id()


def test_a_joined_host_publishes_with_the_starts_key_and_nothing_else_differs(placed) -> None:  # type: ignore[no-untyped-def]
    deployment, on_joined, on_own = placed
    own = remote_plan(on_own, _host_settings(engine_network=NETWORK), instance_id())
    remote = remote_plan(on_joined, _host_settings(advertise_addr=ADDR), instance_id())
    key = selectors.engine_key(deployment_id=deployment.pk, start_token="start-1")
    assert on_joined["engine_key"] == key and remote.api_key == key
    assert remote == dataclasses.replace(own, network=None, publish_host=ADDR, api_key=key)
    assert docker_run_kwargs(remote)["ports"] == {"30000/tcp": (ADDR, None)}
    assert key not in json.dumps(remote.env) and key not in repr(remote)


def test_without_a_network_the_own_host_publishes_on_loopback(placed) -> None:  # type: ignore[no-untyped-def]
    _, _, on_own = placed
    own = remote_plan(on_own, _host_settings(), instance_id())
    assert own.network is None and own.publish_host == "127.0.0.1" and own.api_key == ""
    assert docker_run_kwargs(own)["ports"] == {"30000/tcp": ("127.0.0.1", None)}


def test_an_agent_on_an_engine_network_needs_no_advertised_address() -> None:
    env = {"APPLIANCE_PANEL_URL": "http://web:8000", "APPLIANCE_HOST_NAME": "gpu-host",
           "APPLIANCE_JOIN_TOKEN": "sdj-x"}
    with pytest.raises(SystemExit, match="APPLIANCE_HOST_ADVERTISE_ADDR"):
        RemoteSettings.from_env(env)
    config = RemoteSettings.from_env({**env, "APPLIANCE_ENGINE_NETWORK": NETWORK})
    assert config.engine_network == NETWORK and config.advertise_addr == ""
