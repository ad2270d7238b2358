"""The engine container as the agent starts it: its plan and its identity (the progress its
log lines fold into is appliance.runtime.progress's).

The build worker (web/builder/) ensures the image and hands the deployment over; the agent
(controller.py) starts, follows and ends the container. The plan is every agent's one plan
(appliance.runtime.remote_agent.remote_plan), given this host as a placement and settings.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from appliance.runtime.containers import ContainerPlan, EngineRuntimeError, Identity
from appliance.runtime.remote_agent import SIMULATED_BUILD_ENV, RemoteSettings, remote_plan
from web.deployments.models import Deployment
from web.deployments.services.installation import instance_id
from web.deployments.simulator import simulated_build
from web.store.loadtime import deployment_models_refused

__all__ = ["SIMULATED_BUILD_ENV", "container_plan", "identity_of", "own_host_placement",
           "own_host_settings"]


def identity_of(deployment: Deployment) -> Identity:
    """The engine container's identity: this install, the deployment, this start."""
    return Identity(str(deployment.pk), instance_id(), deployment.start_token)


def own_host_settings() -> RemoteSettings:
    """This host's agent settings as a remote agent's (read at each call: tests change
    them): engines on ENGINE_NETWORK when set, else published on loopback."""
    return RemoteSettings(
        panel_url="", host_name=settings.HOST_NAME, advertise_addr="",
        engine_network=settings.ENGINE_NETWORK,
        models_dir=str(settings.MODELS_DIR or ""), secrets_dir=settings.ENGINE_SECRETS_DIR,
        gpu_requests=settings.ENGINE_GPU_REQUESTS, gpu_check=settings.ENGINE_GPU_CHECK,
        shm_size=settings.ENGINE_SHM_SIZE, pids_limit=settings.ENGINE_PIDS_LIMIT,
        memory_limit=settings.ENGINE_MEMORY_LIMIT, extra_env=dict(settings.ENGINE_EXTRA_ENV),
        stop_timeout_s=settings.ENGINE_STOP_TIMEOUT_S,
        ready_timeout_s=settings.ENGINE_READY_TIMEOUT_S, recipes_dir=settings.RECIPES_DIR,
        build_ca_bundle=settings.BUILD_CA_BUNDLE)


def own_host_placement(deployment: Deployment, image: str) -> dict[str, Any]:
    """The deployment as the host API's placement answer carries it, for this host's agent:
    no API key (its engines are reached on the engine network or loopback only)."""
    return {"id": deployment.pk, "spec": deployment.spec, "image": image,
            "start_token": deployment.start_token, "gpus": list(deployment.gpus),
            "simulated_build": simulated_build(deployment=deployment, image=image)}


def container_plan(deployment: Deployment, image: str) -> ContainerPlan:
    refused = deployment_models_refused(deployment=deployment)
    if refused:  # never mounted: the agent fails the start before this (agent._may_start)
        raise EngineRuntimeError(f"not verified in the model store: {', '.join(refused)}")
    return remote_plan(own_host_placement(deployment, image), own_host_settings(),
                       instance_id())
