"""The Hosts page: each GPU of a host and the deployment (a link) that leases it."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from tests.hostrows import host_reported
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services

pytestmark = pytest.mark.django_db


def _page(user) -> str:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    response = client.get("/hosts/")
    assert response.status_code == 200
    return response.content.decode()


def _row(page: str, host: str, gpu: int) -> str:
    start = page.index(f'id="gpu-{host}-{gpu}"')
    return page[start:page.index("</tr>", start)]


def test_it_shows_each_configured_gpu_and_the_deployment_holding_it(viewer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.GPU_COUNT = 4
    held = deploying.deployment_create(data=spec(gpus=[1, 2]), confirm_warnings=True)
    page = _page(viewer)
    assert "GPUs per APPLIANCE_GPU_COUNT" in page and 'id="gpu-gpu-host-4"' not in page
    for gpu in (1, 2):
        assert f'href="/deployments/{held.pk}/">#{held.pk} kimi-ddtree</a>' in _row(page, "gpu-host", gpu)
    assert "free" in _row(page, "gpu-host", 0) and "free" in _row(page, "gpu-host", 3)
    services.deployment_stop(deployment_id=held.pk)
    assert "free" in _row(_page(viewer), "gpu-host", 1)


def test_it_takes_the_gpus_from_the_agents_nvml_inventory(viewer) -> None:  # type: ignore[no-untyped-def]
    gpus = [{"index": i, "name": "NVIDIA H200", "utilization_pct": 7, "memory_used_gb": 1.5,
             "memory_total_gb": 141.0} for i in range(2)]
    host_reported(name="gpu-host", agent_id="agent@gpu-host", heartbeat_at=timezone.now(),
                  docker={"nvidia": True}, gpu_telemetry={"available": True, "gpus": gpus})
    held = deploying.deployment_create(data=spec(gpus=[1]), confirm_warnings=True)
    page = _page(viewer)
    assert "GPUs per NVML" in page and 'id="gpu-gpu-host-2"' not in page
    assert "NVIDIA H200" in _row(page, "gpu-host", 0) and "1.5 / 141.0 GB" in _row(page, "gpu-host", 0)
    assert f"#{held.pk} kimi-ddtree" in _row(page, "gpu-host", 1)


def test_a_person_without_a_role_may_not_see_it(django_user_model) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(django_user_model.objects.create_user(username="nobody", password="x-pass-12"))
    assert client.get("/hosts/").status_code == 403


def test_it_names_orphaned_engines_with_the_command_that_removes_them(viewer) -> None:  # type: ignore[no-untyped-def]
    strays = [{"name": f"appliance-engine-0123abcd-{i}-old", "status": "running",
               "labels": {"appliance.instance": "0123abcd"}} for i in (1, 2)]
    host_reported(name="gpu-host", agent_id="agent@gpu-host", heartbeat_at=timezone.now(),
                  docker={"nvidia": True, "engine_network_open": "engine network "
                          "appliance-engines is open to the host"},
                  foreign_containers=strays)
    page = _page(viewer)
    assert ("docker rm -f appliance-engine-0123abcd-1-old appliance-engine-0123abcd-2-old"
            in page)
    assert "docker compose down -v" in page and "keeps its GPUs" in page
    assert "engine-network-open" in page and "appliance-engines is open to the host" in page
