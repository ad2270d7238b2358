"""The fleet's REST API for people: join tokens (admins only; the secret in the 201 answer
and never again) and hosts (viewers read; admins drain, undrain, remove)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.rows import ready
from web.fleet import services
from web.fleet.models import FleetHost, JoinToken

from .hosts import joined

pytestmark = pytest.mark.django_db


def _client(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_an_admin_makes_a_join_token_and_sees_its_secret_only_in_that_answer(admin) -> None:  # type: ignore[no-untyped-def]
    client = _client(admin)
    made = client.post("/api/fleet/tokens/", {"host_name": "gpu-2", "ttl_hours": 2},
                       format="json")
    assert made.status_code == 201, made.content
    secret = made.json()["secret"]
    assert secret.startswith("sdj-") and made.json()["state"] == "usable"
    assert made.json()["created_by"] == "ada"
    listed = client.get("/api/fleet/tokens/")
    one = client.get(f"/api/fleet/tokens/{made.json()['id']}/")
    for answer in (listed, one):
        assert answer.status_code == 200 and secret not in answer.content.decode()
        assert "secret" not in answer.content.decode()
    assert listed.json()[0]["prefix"] == secret[:12]


def test_a_join_token_for_a_bad_name_is_refused_naming_the_field(admin) -> None:  # type: ignore[no-untyped-def]
    answer = _client(admin).post("/api/fleet/tokens/", {"host_name": "Not A Host!"},
                                 format="json")
    assert answer.status_code == 400 and "host_name" in answer.json()


def test_an_admin_revokes_a_join_token(admin) -> None:  # type: ignore[no-untyped-def]
    made = services.jointoken_create(host_name="gpu-2")
    answer = _client(admin).post(f"/api/fleet/tokens/{made.token.pk}/revoke/")
    assert answer.status_code == 200 and answer.json()["state"] == "revoked"
    assert JoinToken.objects.get().revoked_at is not None


@pytest.mark.parametrize("actor", ["operator", "viewer"])
def test_only_an_admin_touches_join_tokens(actor, request) -> None:  # type: ignore[no-untyped-def]
    client = _client(request.getfixturevalue(actor))
    made = services.jointoken_create(host_name="gpu-2")
    assert client.get("/api/fleet/tokens/").status_code == 403
    assert client.post("/api/fleet/tokens/", {"host_name": "gpu-3"},
                       format="json").status_code == 403
    assert client.post(f"/api/fleet/tokens/{made.token.pk}/revoke/").status_code == 403
    assert JoinToken.objects.get().revoked_at is None and JoinToken.objects.count() == 1


def test_nobody_logged_out_lists_tokens_or_hosts() -> None:
    client = APIClient()
    assert client.get("/api/fleet/tokens/").status_code in (401, 403)
    assert client.get("/api/fleet/hosts/").status_code in (401, 403)


def test_a_viewer_lists_hosts_with_gpus_docker_version_heartbeat_and_state(viewer) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    answer = _client(viewer).get("/api/fleet/hosts/")
    assert answer.status_code == 200
    host = next(h for h in answer.json() if h["name"] == "gpu-2")
    assert host["state"] == "ready" and host["joined"] is True
    assert len(host["gpus"]) == 8 and host["gpus"][0]["name"] == "NVIDIA H200"
    assert host["docker"]["server_version"] == "26.1.5" and host["agent_version"] == "0.9.0"
    assert host["heartbeat_at"] is not None and host["credential_prefix"]


@pytest.mark.parametrize("actor", ["operator", "viewer"])
def test_only_an_admin_drains_or_removes_a_host(actor, request) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    client = _client(request.getfixturevalue(actor))
    assert client.post("/api/fleet/hosts/gpu-2/drain/").status_code == 403
    assert client.delete("/api/fleet/hosts/gpu-2/").status_code == 403
    assert not FleetHost.objects.joined().get().draining


def test_an_admin_drains_and_undrains_a_host(admin) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    client = _client(admin)
    drained = client.post("/api/fleet/hosts/gpu-2/drain/")
    assert drained.status_code == 200 and drained.json()["state"] == "draining"
    assert client.post("/api/fleet/hosts/gpu-2/undrain/").json()["state"] == "ready"
    assert client.post("/api/fleet/hosts/gpu-9/drain/").status_code == 404


def test_removing_a_host_that_runs_an_engine_is_a_conflict_that_names_it(admin) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    running = ready()
    services.placement_assign(deployment=running, host_name="gpu-2")
    answer = _client(admin).delete("/api/fleet/hosts/gpu-2/")
    assert answer.status_code == 409 and f"#{running.pk} kimi-ddtree" in answer.json()["detail"]
    assert FleetHost.objects.exists()


def test_an_admin_removes_an_idle_host(admin) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    client = _client(admin)
    assert client.delete("/api/fleet/hosts/gpu-2/").status_code == 204
    assert not FleetHost.objects.exists()
    assert client.delete("/api/fleet/hosts/gpu-2/").status_code == 404


def test_a_hosts_held_and_free_gpus_come_from_its_leases(viewer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.HOST_NAME = "gpu-2"
    joined("gpu-2")
    holder = ready(gpus=[2, 5])
    host = _client(viewer).get("/api/fleet/hosts/gpu-2/").json()
    assert host["held_gpus"] == [2, 5] and host["free_gpus"] == 6
    assert host["deployments"] == [holder.pk]
