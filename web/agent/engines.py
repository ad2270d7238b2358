"""The engine container as the agent starts it: its plan and its identity (the progress its
log lines fold into is appliance.runtime.progress's).

The build worker (web/builder/) ensures the image and hands the deployment over; the agent
(controller.py) starts, follows and ends the container.
"""

from __future__ import annotations

import json

from django.conf import settings

from appliance.engine.launch import launch_args
from appliance.engine.refusals import build_refusals, recipe_source
from appliance.engine.spec import spec_from_dict
from appliance.preflight import gpu_check_args
from appliance.runtime.containers import ContainerPlan, EngineRuntimeError, Identity
from appliance.runtime.mounts import engine_model_mounts
from web.deployments.models import Deployment
from web.deployments.services.installation import instance_id
from web.deployments.simulator import image_is_simulator
from web.store.loadtime import deployment_models_refused

# The simulator's knob naming the engine build whose refusals it imitates
# (docker/test-engine/sglang/test_engine/refusals.py).
SIMULATED_BUILD_ENV = "TEST_ENGINE_BUILD"


def identity_of(deployment: Deployment) -> Identity:
    """The engine container's identity: this install, the deployment, this start."""
    return Identity(str(deployment.pk), instance_id(), deployment.start_token)


def container_plan(deployment: Deployment, image: str) -> ContainerPlan:
    spec = spec_from_dict(deployment.spec)
    launch = launch_args(spec)
    refused = deployment_models_refused(deployment=deployment)
    if refused:  # never mounted: the agent fails the start before this (agent._may_start)
        raise EngineRuntimeError(f"not verified in the model store: {', '.join(refused)}")
    volumes: dict[str, dict[str, str]] = {}
    if settings.MODELS_DIR:
        volumes = engine_model_mounts(argv=launch.argv, models_dir=str(settings.MODELS_DIR))
    env = {**launch.env, **settings.ENGINE_EXTRA_ENV}
    simulated_build(env, deployment=deployment, image=image)
    if spec.self_check and settings.ENGINE_GPU_CHECK:
        # The image's entrypoint runs appliance.selfcheck with these before the engine.
        env["APPLIANCE_GPU_CHECK"] = "1"
        env["APPLIANCE_GPU_CHECK_ARGS"] = json.dumps(gpu_check_args(spec))
    return ContainerPlan(
        deployment_id=str(deployment.pk),
        image=image,
        argv=launch.argv,
        env=env,
        gpus=list(deployment.gpus) if settings.ENGINE_GPU_REQUESTS else [],
        container_port=spec.engine.port,
        network=settings.ENGINE_NETWORK or None,
        volumes=volumes,
        instance_id=instance_id(),
        start_token=deployment.start_token,
        shm_size=spec.shm_size or settings.ENGINE_SHM_SIZE,
        pids_limit=settings.ENGINE_PIDS_LIMIT or None,
        mem_limit=settings.ENGINE_MEMORY_LIMIT or None,
        # Only this deployment's declared names; their values are read at container start.
        secrets=list(launch.secrets),
        secrets_dir=settings.ENGINE_SECRETS_DIR,
    )


def simulated_build(env: dict[str, str], *, deployment: Deployment, image: str) -> None:
    """On the simulator's image, the build it imitates is the one the deployment's recipe
    pins (what it refuses is that build's, as the gateway and the deployment's page take
    it), where the refusal table has that build and algorithm; else the simulator's own
    default. A value the environment already names (a test's) is kept."""
    if SIMULATED_BUILD_ENV in env or not image_is_simulator(image=image):
        return
    source = recipe_source(deployment.recipe, settings.RECIPES_DIR)
    build = build_refusals(source)
    if source and build is not None and build.needs(deployment.algorithm or "NONE") is not None:
        env[SIMULATED_BUILD_ENV] = source
