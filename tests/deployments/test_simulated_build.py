"""On the simulator's image the agent (its plan: tests/plans.py) names the engine build the deployment's recipe pins
(TEST_ENGINE_BUILD), so the simulator refuses what that build refuses, as the gateway and the
deployment's page take it (appliance/engine/refusals.py): DFLASH on the 0.5.23 recipe serves
log-probs there too. A real engine image gets no such variable, nor a build the table cannot
answer for (the simulator's default stands), and a value the environment names is kept."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from appliance.runtime.remote_agent import SIMULATED_BUILD_ENV
from tests.hostrows import host_reported
from tests.plans import own_host_plan
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.simulator import simulator_images_forget

pytestmark = pytest.mark.django_db
SIMULATOR = "appliance-test-engine:latest"


@pytest.fixture(autouse=True)
def simulator_host() -> Any:
    simulator_images_forget()
    host_reported(name="sim-a", agent_id="agent@sim-a", heartbeat_at=timezone.now(),
                  docker={"nvidia": False, "gpu_requests": False,
                          "simulator_images": [SIMULATOR]})
    yield
    simulator_images_forget()


def _deployment(name: str, *, recipe: str, algorithm: str) -> Deployment:
    data = spec(name=name, recipe=recipe, engine__speculative_algorithm=algorithm)
    return Deployment.objects.create(name=name, spec=data, recipe=recipe, algorithm=algorithm,
                                     gpus=data["gpus"], status=DeploymentStatus.STARTING)


def test_the_simulator_imitates_the_build_the_recipe_pins() -> None:
    dflash = _deployment("d", recipe="kimi-k2.6-dflash", algorithm="DFLASH")
    ddtree = _deployment("t", recipe="kimi-k2.6-ddtree", algorithm="DDTREE")
    assert own_host_plan(dflash, SIMULATOR).env[SIMULATED_BUILD_ENV] == "0.5.23"
    assert own_host_plan(ddtree, SIMULATOR).env[SIMULATED_BUILD_ENV] == "433c58ed7"
    # A real engine's image: nothing of the simulator's.
    assert SIMULATED_BUILD_ENV not in own_host_plan(dflash, "appliance-engine:kimi").env


def test_a_build_without_the_algorithm_leaves_the_simulators_default() -> None:
    # 0.5.23 has no DDTREE: the simulator would stop at launch if told to imitate it.
    odd = _deployment("odd", recipe="kimi-k2.6-dflash", algorithm="DDTREE")
    assert SIMULATED_BUILD_ENV not in own_host_plan(odd, SIMULATOR).env


def test_a_build_the_environment_names_is_kept() -> None:
    dflash = _deployment("d", recipe="kimi-k2.6-dflash", algorithm="DFLASH")
    extra = f"{SIMULATED_BUILD_ENV}=433c58ed7"
    plan = own_host_plan(dflash, SIMULATOR, APPLIANCE_ENGINE_EXTRA_ENV=extra)
    assert plan.env[SIMULATED_BUILD_ENV] == "433c58ed7"
