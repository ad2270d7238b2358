"""The fleet pages: hosts (viewers see them; admins drain and remove) and join tokens
(admins only; a new token is on the answer that made it and never again)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.rows import ready
from web.fleet import services
from web.fleet.models import FleetHost, JoinToken

from .hosts import joined

pytestmark = pytest.mark.django_db


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def test_the_token_page_shows_a_new_token_once_and_never_again(admin) -> None:  # type: ignore[no-untyped-def]
    client = _client(admin)
    made = client.post("/fleet/tokens/", {"host_name": "gpu-2", "ttl_hours": 24})
    assert made.status_code == 200
    page = made.content.decode()
    token = JoinToken.objects.get()
    start = page.index(f"sdj-{token.prefix}")
    secret = page[start:page.index("<", start)]
    assert services.secret_digest(secret) == token.digest
    assert "APPLIANCE_JOIN_TOKEN=" + secret in page
    again = client.get("/fleet/tokens/").content.decode()
    assert secret not in again and f"sdj-{token.prefix}…" in again and "usable" in again


def test_the_tokens_hint_names_the_host_and_the_panels_address_as_hosts_reach_it(
        admin, settings) -> None:  # type: ignore[no-untyped-def]
    client = _client(admin)
    # The browser's address is this machine's loopback name: printed, and said to be so.
    page = client.post("/fleet/tokens/", {"host_name": "gpu-2", "ttl_hours": 1},
                       HTTP_HOST="localhost:8000").content.decode()
    secret = JoinToken.objects.get()
    assert ("APPLIANCE_PANEL_URL=http://localhost:8000\nAPPLIANCE_HOST_NAME=gpu-2\n"
            "APPLIANCE_JOIN_TOKEN=sdj-" + secret.prefix) in page
    assert 'id="panel-url-note"' in page and "a GPU host elsewhere cannot reach it" in page
    assert "docker compose -f docker/compose.host.yaml up -d" in page
    # The address other machines reach it at, where the panel is told it.
    settings.PUBLIC_URL = "https://panel.example:8000"
    page = client.post("/fleet/tokens/", {"host_name": "gpu-3", "ttl_hours": 1},
                       HTTP_HOST="localhost:8000").content.decode()
    assert "APPLIANCE_PANEL_URL=https://panel.example:8000\nAPPLIANCE_HOST_NAME=gpu-3\n" in page
    assert 'id="panel-url-note"' not in page
    # A browser that used the machine's own name gets that address, with no note.
    settings.PUBLIC_URL = ""
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "panel-7.lab"]
    page = client.post("/fleet/tokens/", {"host_name": "gpu-4", "ttl_hours": 1},
                       HTTP_HOST="panel-7.lab:8000").content.decode()
    assert "APPLIANCE_PANEL_URL=http://panel-7.lab:8000\nAPPLIANCE_HOST_NAME=gpu-4\n" in page
    assert 'id="panel-url-note"' not in page


def test_the_token_page_shows_who_used_a_token_and_revokes_it(admin) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    client = _client(admin)
    spent = JoinToken.objects.get()
    page = client.get("/fleet/tokens/").content.decode()
    row = page[page.index(f'id="token-{spent.pk}"'):]
    row = row[:row.index("</tr>")]
    # Its join spent it: shown as such, with nothing left to revoke.
    assert '<td class="state">spent</td>' in row and "<td>gpu-2</td>" in row
    assert "Revoke" not in row
    assert "its join spends\nit" in page
    client.post("/fleet/tokens/", {"host_name": "gpu-3", "ttl_hours": 1})
    unused = JoinToken.objects.get(host_name="gpu-3")
    client.post(f"/fleet/tokens/{unused.pk}/revoke/")
    assert JoinToken.objects.get(pk=unused.pk).revoked_at is not None
    assert "revoked" in client.get("/fleet/tokens/").content.decode()


@pytest.mark.parametrize("actor", ["operator", "viewer"])
def test_only_an_admin_opens_the_token_page(actor, request) -> None:  # type: ignore[no-untyped-def]
    client = _client(request.getfixturevalue(actor))
    assert client.get("/fleet/tokens/").status_code == 403
    assert client.post("/fleet/tokens/", {"host_name": "gpu-2", "ttl_hours": 1}).status_code == 403
    assert not JoinToken.objects.exists()


def test_the_fleet_page_lists_a_hosts_gpus_docker_agent_heartbeat_and_state(viewer) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    page = _client(viewer).get("/fleet/").content.decode()
    start = page.index('id="fleet-host-gpu-2"')
    row = page[start:page.index("</tr>", start)]
    assert "8 GPUs (NVML)" in row and "NVIDIA H200, 140 GB" in row
    assert "Docker 26.1.5" in row and "NVIDIA runtime" in row and "0.9.0" in row
    assert "status-ready" in row and "s ago" in row
    assert "Drain" not in row  # a viewer's page has no admin buttons


def test_the_fleet_page_says_lost_for_a_silent_host(viewer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENT_SILENT_S = 30
    joined("gpu-2")
    from datetime import timedelta

    from django.utils import timezone
    FleetHost.objects.update(heartbeat_at=timezone.now() - timedelta(seconds=45))
    page = _client(viewer).get("/fleet/").content.decode()
    assert "status-lost" in page and "for 30 s is" in page


def test_an_admin_drains_and_is_refused_removal_while_an_engine_runs(admin) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    running = ready()
    services.placement_assign(deployment=running, host_name="gpu-2")
    client = _client(admin)
    drained = client.post("/fleet/hosts/gpu-2/drain/", {"draining": "1"}, follow=True)
    assert "is draining" in drained.content.decode() and FleetHost.objects.joined().get().draining
    refused = client.post("/fleet/hosts/gpu-2/remove/", {"confirm": "yes"},
                          follow=True).content.decode()
    assert f"#{running.pk} kimi-ddtree (ready)" in refused and FleetHost.objects.exists()


def test_remove_asks_first_and_removes_only_when_confirmed(admin) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    client = _client(admin)
    fleet = client.get("/fleet/").content.decode()
    assert 'href="/fleet/hosts/gpu-2/remove/">Remove…</a>' in fleet
    asked = client.get("/fleet/hosts/gpu-2/remove/").content.decode()
    assert "Remove host gpu-2?" in asked and "refuses its\n    credential from now on" in asked
    assert 'name="confirm" value="yes"' in asked
    # A POST without the confirmation (one click on an old page) only asks.
    unconfirmed = client.post("/fleet/hosts/gpu-2/remove/")
    assert unconfirmed.status_code == 200 and b'id="confirm-remove"' in unconfirmed.content
    assert FleetHost.objects.filter(name="gpu-2").exists()
    done = client.post("/fleet/hosts/gpu-2/remove/", {"confirm": "yes"}, follow=True)
    assert "Host gpu-2 removed" in done.content.decode()
    assert not FleetHost.objects.filter(name="gpu-2").exists()


@pytest.mark.parametrize("actor", ["operator", "viewer"])
def test_only_an_admin_drains_or_removes_on_the_page(actor, request) -> None:  # type: ignore[no-untyped-def]
    joined("gpu-2")
    client = _client(request.getfixturevalue(actor))
    assert client.post("/fleet/hosts/gpu-2/drain/").status_code == 403
    assert client.post("/fleet/hosts/gpu-2/remove/", {"confirm": "yes"}).status_code == 403
    assert client.get("/fleet/hosts/gpu-2/remove/").status_code == 403
    assert FleetHost.objects.exists() and not FleetHost.objects.joined().get().draining


def test_a_person_without_a_role_does_not_see_the_fleet(django_user_model) -> None:  # type: ignore[no-untyped-def]
    nobody = django_user_model.objects.create_user(username="nobody", password="x-pass-12")
    assert _client(nobody).get("/fleet/").status_code == 403


def test_the_fleet_page_counts_a_hosts_free_gpus_and_lists_its_engines(viewer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.HOST_NAME = "gpu-2"  # the host this panel's GPU leases are taken on
    joined("gpu-2")
    holder = ready(gpus=[0, 1])
    page = _client(viewer).get("/fleet/").content.decode()
    start = page.index('id="fleet-host-gpu-2"')
    row = page[start:page.index("</tr>", start)]
    assert "6 free" in row and f'href="/deployments/{holder.pk}/"' in row


def test_a_simulated_host_is_described_as_simulated_and_a_real_one_without_runtime_warned(
        viewer) -> None:  # type: ignore[no-untyped-def]
    # The trial's hosts: the simulator's image, no NVIDIA runtime, no GPUs asked of Docker.
    sim = {"server_version": "20.10.24", "runtimes": ["runc"], "nvidia": False,
           "cdi_devices": [], "gpu_requests": False,
           "simulator_images": ["appliance-test-engine:latest"]}
    joined("sim-a", gpus=None, gpu_count=4, docker=sim)
    # A host meant for real engines whose Docker lacks the runtime: a fault, said as one.
    joined("gpu-9", docker={**sim, "gpu_requests": True, "simulator_images": []})
    client = _client(viewer)
    for url, start in (("/fleet/", 'id="fleet-host-{}"'), ("/", 'id="host-{}"')):
        page = client.get(url).content.decode()
        sim_row = page[page.index(start.format("sim-a")):]
        sim_row = sim_row[:sim_row.index("</tr>" if url == "/fleet/" else "</section>")]
        assert "Simulated GPUs: this host runs the simulator" in sim_row, url
        assert "no NVIDIA runtime</strong>" not in sim_row and "cannot be given GPUs" not in \
            sim_row, url
        real = page[page.index(start.format("gpu-9")):]
        real = real[:real.index("</tr>" if url == "/fleet/" else "</section>")]
        assert "<strong>no NVIDIA runtime</strong>: engines cannot be given GPUs." in real, url


def test_a_hosts_report_says_whether_its_agent_gives_engines_gpus() -> None:
    from appliance.runtime.agent_settings import RemoteSettings
    from appliance.runtime.containers import EngineRuntime
    from appliance.runtime.remote_agent import host_report

    env = {"APPLIANCE_PANEL_URL": "http://panel:8000", "APPLIANCE_HOST_NAME": "sim-a",
           "APPLIANCE_HOST_ADVERTISE_ADDR": "10.0.0.9", "APPLIANCE_GPU_COUNT": "4"}
    runtime = EngineRuntime()  # this machine's real Docker
    for value, said in (("false", False), ("true", True)):
        config = RemoteSettings.from_env({**env, "APPLIANCE_ENGINE_GPU_REQUESTS": value})
        facts = services.host_facts_from(host_report(runtime, config))
        assert facts.docker["gpu_requests"] is said
        assert "runtimes" in facts.docker  # Docker's own facts beside it


def test_a_hosts_report_carries_nvmls_driver_version_to_the_panel(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from appliance.runtime import gpu_telemetry
    from appliance.runtime.agent_settings import RemoteSettings
    from appliance.runtime.containers import EngineRuntime
    from appliance.runtime.remote_agent import host_report

    config = RemoteSettings.from_env({
        "APPLIANCE_PANEL_URL": "http://panel:8000", "APPLIANCE_HOST_NAME": "gpu-9",
        "APPLIANCE_HOST_ADVERTISE_ADDR": "10.0.0.9", "APPLIANCE_GPU_COUNT": "2"})
    runtime = EngineRuntime()  # this machine's real Docker
    h200 = gpu_telemetry.GpuReading(index=0, name="NVIDIA H200", uuid="GPU-0a",
                                    memory_total_gb=150.1)
    monkeypatch.setattr(gpu_telemetry, "collect", lambda: gpu_telemetry.Telemetry(
        True, driver_version="580.65.06", gpus=[h200]))
    report = host_report(runtime, config)
    assert report["driver_version"] == "580.65.06"
    facts = services.host_facts_from(report)
    assert facts.driver_version == "580.65.06" and facts.gpu_source == "nvml"
    # Without NVML there is no driver to report: the GPU count goes instead.
    monkeypatch.setattr(gpu_telemetry, "collect",
                        lambda: gpu_telemetry.Telemetry(False, "no NVML here"))
    report = host_report(runtime, config)
    assert "driver_version" not in report and report["gpu_count"] == 2
    assert services.host_facts_from(report).driver_version is None
