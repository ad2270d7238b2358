"""What an engine container is: its plan (ContainerPlan: everything needed to start it),
its identity (Identity: the install's instance id, the deployment id and a per-start token,
carried in its labels and name; appliance/runtime/containers.py adopts or stops a container
only when all three match) and docker-py's `containers.run` arguments for it. Pure: no
Docker call here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from docker.types import DeviceRequest

LABEL_DEPLOYMENT = "appliance.deployment"
LABEL_MANAGED = "appliance.managed"
# Compose's own labels: which project and service a container belongs to.
COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
LABEL_INSTANCE = "appliance.instance"
LABEL_START = "appliance.start-token"
NAME_PREFIX = "appliance-engine-"
# The secret file an engine's API key arrives in (docker/engine/runtime/entrypoint.py).
ENGINE_API_KEY_SECRET = "APPLIANCE_ENGINE_API_KEY"


@dataclass
class ContainerPlan:
    """Everything needed to start one deployment's engine container."""

    deployment_id: str
    image: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)
    container_port: int = 30000
    # With a network the worker reaches the engine by container name and nothing is
    # published; without one the port is published on publish_host (loopback) only.
    network: str | None = None
    publish_host: str = "127.0.0.1"
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    # The container's own /dev/shm, sized for NCCL and SGLang's shared-memory transport
    # (SGLang's docs suggest the host's IPC namespace instead, which would let the engine,
    # and any trust_remote_code model code in it, read and write every /dev/shm segment on
    # the host, PostgreSQL's included).
    shm_size: str = "32g"
    pids_limit: int | None = 8192
    mem_limit: str | None = None
    # Secret names (the spec's `secrets:`): their values are read from the store
    # (appliance.runtime.secrets) only when the container starts, never kept in the plan.
    secrets: list[str] = field(default_factory=list)
    secrets_dir: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    # The engine's API key for this start (a fleet host's engine, published on the host's
    # network): put in as the secret file ENGINE_API_KEY_SECRET, which the entrypoint turns
    # into SGLang's --api-key; never in the configuration. Not shown in the plan's repr.
    api_key: str = field(default="", repr=False)
    # Identity (see the module docstring); empty in tests that start bare containers.
    instance_id: str = ""
    start_token: str = ""

    @property
    def identity(self) -> Identity:
        return Identity(str(self.deployment_id), self.instance_id, self.start_token)


@dataclass(frozen=True)
class Identity:
    """Which engine container is a deployment's: all given parts must match."""

    deployment_id: str
    instance_id: str = ""
    start_token: str = ""

    def labels(self) -> dict[str, str]:
        labels = {LABEL_DEPLOYMENT: self.deployment_id, LABEL_MANAGED: "1"}
        if self.instance_id:
            labels[LABEL_INSTANCE] = self.instance_id
        if self.start_token:
            labels[LABEL_START] = self.start_token
        return labels

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels().items())

    @property
    def name(self) -> str:
        return container_name(self.deployment_id, self.instance_id, self.start_token)


def container_name(deployment_id: str, instance_id: str = "", start_token: str = "") -> str:
    """Deterministic container name; characters Docker rejects become '-'."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", str(deployment_id))
    if not instance_id:
        return f"{NAME_PREFIX}{safe}"
    return f"{NAME_PREFIX}{instance_id[:8]}-{safe}-{start_token[:8]}"


def docker_run_kwargs(plan: ContainerPlan) -> dict[str, Any]:
    """The docker-py `containers.run` arguments for a plan (pure; shown in dry runs)."""
    labels = {**plan.labels, **plan.identity.labels()}
    kwargs: dict[str, Any] = {
        "image": plan.image,
        "command": list(plan.argv),
        "name": plan.identity.name,
        "labels": labels,
        "environment": dict(plan.env),
        "detach": True,
        "volumes": plan.volumes or None,
        # An init as PID 1 forwards SIGTERM and reaps SGLang's worker processes; without
        # it a stop that lands before Python installs its handler waits the full timeout.
        "init": True,
        # Its own IPC namespace (Docker's default) with a /dev/shm large enough for NCCL:
        # never ipc_mode="host" (see ContainerPlan.shm_size).
        "shm_size": plan.shm_size,
        "security_opt": ["no-new-privileges:true"],
    }
    if plan.pids_limit:
        kwargs["pids_limit"] = plan.pids_limit
    if plan.mem_limit:
        kwargs["mem_limit"] = plan.mem_limit
    if plan.network:
        # Reached by name on the engine network only; nothing is published on the host.
        kwargs["network"] = plan.network
    else:
        kwargs["ports"] = {f"{plan.container_port}/tcp": (plan.publish_host, None)}
    if plan.gpus:
        kwargs["device_requests"] = [
            DeviceRequest(driver="nvidia", device_ids=[str(g) for g in plan.gpus],
                          capabilities=[["gpu"]])
        ]
    return kwargs
