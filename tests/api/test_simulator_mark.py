"""Where the panel shows its simulator banner, the API's answers say so too: a deployment
whose image is the simulator's (a host reported it, web/deployments/simulator.py) reads
`simulator: true` in /api/deployments/, its detail and its summary, any other
`simulator: false`."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tests.hostrows import host_reported
from tests.rows import queued
from web.deployments.models import Deployment
from web.deployments.simulator import simulator_images_forget

pytestmark = pytest.mark.django_db
SIMULATOR = "appliance-test-engine:latest"


@pytest.fixture(autouse=True)
def _fresh_images() -> Any:
    simulator_images_forget()
    yield
    simulator_images_forget()


def test_a_deployment_of_the_simulators_image_says_so_in_the_api(viewer, token_for) -> None:  # type: ignore[no-untyped-def]
    simulated = queued(name="sim", gpus=[0])
    real = queued(name="real", gpus=[1])
    # The host's report (after the deployments: pre-flight reads the same row's runtimes).
    host_reported(name="sim-a", agent_id="agent@sim-a", heartbeat_at=timezone.now(),
                  docker={"nvidia": False, "gpu_requests": False,
                          "simulator_images": [SIMULATOR]})
    Deployment.objects.filter(pk=simulated.pk).update(image=SIMULATOR)
    Deployment.objects.filter(pk=real.pk).update(image="appliance-engine:kimi-433c58ed7")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(viewer)}")
    listed = {d["name"]: d["simulator"] for d in api.get("/api/deployments/").json()["results"]}
    assert listed == {"sim": True, "real": False}
    assert api.get(f"/api/deployments/{simulated.pk}/").json()["simulator"] is True
    assert api.get(f"/api/deployments/{real.pk}/").json()["simulator"] is False
    # The summary, the read a dashboard polls, says it too.
    assert api.get(f"/api/deployments/{simulated.pk}/summary/").json()["simulator"] is True
    assert api.get(f"/api/deployments/{real.pk}/summary/").json()["simulator"] is False
