"""The engine container the fleet's agent plans for a deployment on the panel's own host, made
as the agent makes it: the host API's answer for that host (web/fleet/selectors.py
host_placements), read by remote_plan with the agent's settings from its environment
(RemoteSettings.from_env, as compose.yaml's `agent` service gives them)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.container_plan import ContainerPlan
from appliance.runtime.remote_agent import remote_plan
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from web.fleet import selectors
from web.fleet.models import FleetHost, Placement, unjoined_credential

# What compose.yaml gives the own host's agent, less what a plan does not read.
OWN_HOST_ENV = {"APPLIANCE_PANEL_URL": "http://web:8000",
                "APPLIANCE_ENGINE_NETWORK": "appliance-engines",
                "APPLIANCE_MODELS_DIR": "/models",
                "APPLIANCE_JOIN_TOKEN": "sdj-not-read-by-a-plan"}


def own_host_settings(**env: str) -> RemoteSettings:
    """The own host's agent settings from its environment: OWN_HOST_ENV with `env` over it
    (an empty value drops a name)."""
    merged = {"APPLIANCE_HOST_NAME": str(settings.HOST_NAME), **OWN_HOST_ENV, **env}
    return RemoteSettings.from_env({k: v for k, v in merged.items() if v})


def own_host_placement(deployment: Deployment, image: str = "") -> dict[str, Any]:
    """The deployment as the host API answers the own host's agent once it is to start
    (JSON, as the agent reads it): placed on the own host (a row made with none is placed
    there, as fleet/0006 places an older install's rows), `starting`, with `image`."""
    host, _ = FleetHost.objects.get_or_create(
        name=settings.HOST_NAME,
        defaults={"credential_made_at": timezone.now(), **unjoined_credential()})
    if not Placement.objects.filter(deployment=deployment).exists():
        Placement.objects.create(deployment=deployment, replica=0, host=host)
    assert Placement.objects.filter(deployment=deployment, host=host).exists(), (
        f"deployment #{deployment.pk} is placed on another host than the panel's own")
    changes: dict[str, Any] = {"start_token": deployment.start_token or "plan-test"}
    if deployment.status not in (DeploymentStatus.STARTING, DeploymentStatus.LOADING):
        changes["status"] = DeploymentStatus.STARTING
    if image:
        changes["image"] = image
    Deployment.objects.filter(pk=deployment.pk).update(**changes)
    deployment.refresh_from_db()
    [row] = [r for r in selectors.host_placements(host=host) if r["id"] == deployment.pk]
    return dict(json.loads(json.dumps(row, cls=DjangoJSONEncoder)))


def own_host_plan(deployment: Deployment, image: str = "", **env: str) -> ContainerPlan:
    """The container the own host's agent runs for `deployment` (its settings: `env`)."""
    return remote_plan(own_host_placement(deployment, image), own_host_settings(**env),
                       instance_id())
