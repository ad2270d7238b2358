"""Every agent plans an engine container one way (remote_plan): the panel's own agent gives
it this host as a placement and its settings (web/agent/engines.py container_plan), a joined
host's agent the placement the host API answers with. For the same spec the two roads give
the same ContainerPlan: on the engine network, nothing published and no key, for the own
host; published on the advertised address with the start's key for a joined host, and no
other field apart."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.test import override_settings
from django.utils import timezone

from appliance.runtime.containers import docker_run_kwargs
from appliance.runtime.remote_agent import SIMULATED_BUILD_ENV, RemoteSettings, remote_plan
from tests.fleet.hosts import joined
from tests.hostrows import host_reported
from tests.specs import spec
from web.agent.engines import container_plan
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from web.deployments.simulator import simulator_images_forget
from web.fleet import selectors, services

pytestmark = pytest.mark.django_db
SIMULATOR = "appliance-test-engine:latest"
NETWORK = "appliance-engines-plan-test"
ADDR = "10.0.0.12"
# The engine settings both agents are given: the panel's Django settings, the host's env.
ENGINE_SETTINGS = {"MODELS_DIR": "/srv/models", "ENGINE_SECRETS_DIR": "/run/secrets/test",
                   "ENGINE_EXTRA_ENV": {"TEST_ENGINE_TOKEN_S": "0.01"},
                   "ENGINE_GPU_REQUESTS": True, "ENGINE_GPU_CHECK": True,
                   "ENGINE_SHM_SIZE": "16g", "ENGINE_PIDS_LIMIT": 4096,
                   "ENGINE_MEMORY_LIMIT": "200g"}


def _host_settings(**changes: Any) -> RemoteSettings:
    return dataclasses.replace(RemoteSettings(
        panel_url="http://panel:8000", host_name="gpu-2", advertise_addr="",
        models_dir="/srv/models", secrets_dir="/run/secrets/test",
        extra_env={"TEST_ENGINE_TOKEN_S": "0.01"}, gpu_requests=True, gpu_check=True,
        shm_size="16g", pids_limit=4096, memory_limit="200g"), **changes)


@pytest.fixture
def placed() -> tuple[Deployment, dict[str, Any]]:
    """A starting deployment on the simulator's image with a secret and two GPUs, placed on
    the joined host gpu-2, and its placement as gpu-2's agent reads it (JSON)."""
    simulator_images_forget()
    host_reported(name="sim-a", agent_id="agent@sim-a", heartbeat_at=timezone.now(),
                  docker={"simulator_images": [SIMULATOR]})
    data = spec(name="one-plan", recipe="kimi-k2.6-ddtree", secrets=["HF_TOKEN"],
                gpus=[2, 3], engine__speculative_algorithm="DDTREE")
    deployment = Deployment.objects.create(
        name="one-plan", spec=data, recipe="kimi-k2.6-ddtree", algorithm="DDTREE",
        gpus=data["gpus"], status=DeploymentStatus.STARTING, image=SIMULATOR,
        start_token="start-1")
    host = joined("gpu-2").host
    services.placement_assign(deployment=deployment, host_name="gpu-2")
    [row] = selectors.host_placements(host=host)
    yield deployment, json.loads(json.dumps(row, cls=DjangoJSONEncoder))
    simulator_images_forget()


def test_the_own_host_on_its_network_and_a_placement_there_plan_alike(placed) -> None:  # type: ignore[no-untyped-def]
    deployment, placement = placed
    with override_settings(ENGINE_NETWORK=NETWORK, **ENGINE_SETTINGS):
        own = container_plan(deployment, SIMULATOR)
    # The own host's placement carries no key: its engines are on the closed network only.
    keyless = {k: v for k, v in placement.items() if k != "engine_key"}
    remote = remote_plan(keyless, _host_settings(engine_network=NETWORK), instance_id())
    assert remote == own
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
    deployment, placement = placed
    with override_settings(ENGINE_NETWORK=NETWORK, **ENGINE_SETTINGS):
        own = container_plan(deployment, SIMULATOR)
    remote = remote_plan(placement, _host_settings(advertise_addr=ADDR), instance_id())
    key = selectors.engine_key(deployment_id=deployment.pk, start_token="start-1")
    assert placement["engine_key"] == key and remote.api_key == key
    assert remote == dataclasses.replace(own, network=None, publish_host=ADDR, api_key=key)
    assert docker_run_kwargs(remote)["ports"] == {"30000/tcp": (ADDR, None)}
    assert key not in json.dumps(remote.env) and key not in repr(remote)


def test_without_a_network_the_own_host_publishes_on_loopback_as_before(placed) -> None:  # type: ignore[no-untyped-def]
    deployment, placement = placed
    with override_settings(ENGINE_NETWORK="", **ENGINE_SETTINGS):
        own = container_plan(deployment, SIMULATOR)
    assert own.network is None and own.publish_host == "127.0.0.1" and own.api_key == ""
    keyless = {k: v for k, v in placement.items() if k != "engine_key"}
    assert remote_plan(keyless, _host_settings(), instance_id()) == own


def test_an_agent_on_an_engine_network_needs_no_advertised_address() -> None:
    env = {"APPLIANCE_PANEL_URL": "http://web:8000", "APPLIANCE_HOST_NAME": "gpu-host",
           "APPLIANCE_JOIN_TOKEN": "sdj-x"}
    with pytest.raises(SystemExit, match="APPLIANCE_HOST_ADVERTISE_ADDR"):
        RemoteSettings.from_env(env)
    config = RemoteSettings.from_env({**env, "APPLIANCE_ENGINE_NETWORK": NETWORK})
    assert config.engine_network == NETWORK and config.advertise_addr == ""
