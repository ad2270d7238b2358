"""A row placed on a joined host whose new run has not reached its host yet (restarted after
a death, or started again by the builder) is that host's from the start: when the host is
lost before its agent's first step, every read says `unknown`, as for its other rows, never
the `starting` it was left in."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from appliance.logs.causes import Diagnosis
from tests.rows import queued
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services import lifecycle
from web.fleet import hostwrites
from web.fleet.models import FleetHost

from .hosts import joined

pytestmark = pytest.mark.django_db
DIED = Diagnosis("engine-exited", "The engine container ended with exit code 255.",
                 "Nothing to fix in the engine.")


def _ready_on_host(name: str) -> Deployment:
    """Replica 0 of two, placed on `name`, started and found ready by that host's steps."""
    joined(name)
    made = queued(host=name, gpus=[0], replicas=2)
    assert made.placements.get().host.name == name
    services.deployment_mark_starting(deployment_id=made.pk, image="img", start_token="t1")
    host = FleetHost.objects.get(name=name)
    hostwrites.host_step(host=host, deployment_id=made.pk, step=hostwrites.host_step_from(
        {"step": "ready", "start_token": "t1", "engine_url": "http://10.0.0.2:30000"}))
    row = Deployment.objects.get(pk=made.pk)
    assert (row.status, row.agent_id) == (DeploymentStatus.READY, f"agent@{name}")
    return row


def _lost(name: str) -> None:
    past = timezone.now() - timedelta(minutes=5)
    FleetHost.objects.filter(name=name).update(heartbeat_at=past)


def _reads(api: APIClient, pk: int) -> tuple[str, str]:
    listed = {d["id"]: d["status"] for d in api.get("/api/deployments/").json()["results"]}
    return api.get(f"/api/deployments/{pk}/").json()["status"], listed[pk]


def test_a_row_restarted_after_a_death_and_lost_before_its_first_step_reads_unknown(
        viewer: Any, token_for: Any) -> None:
    row = _ready_on_host("gpu-2")
    # A replica is brought back after its engine died: a new run, whose host has not
    # stepped yet.
    assert lifecycle.deployment_restart_after_death(
        deployment_id=row.pk, start_token="t1", diagnosis=DIED, message="died")
    _lost("gpu-2")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(viewer)}")
    assert Deployment.objects.get(pk=row.pk).status == DeploymentStatus.STARTING
    assert _reads(api, row.pk) == ("unknown", "unknown")


def test_a_row_the_builder_starts_on_a_host_lost_before_its_first_step_reads_unknown(
        viewer: Any, token_for: Any) -> None:
    joined("gpu-2")
    made = queued(host="gpu-2", gpus=[0])
    services.deployment_mark_starting(deployment_id=made.pk, image="img", start_token="t1")
    _lost("gpu-2")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(viewer)}")
    assert _reads(api, made.pk) == ("unknown", "unknown")
