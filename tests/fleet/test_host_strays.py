"""A joined host's strays (appliance.runtime.strays): containers with the appliance's labels
that no engine placed on the host owns. Its agent lists them in its heartbeat and warns of
them; the panel checks them (a 400 naming the field) and stores them on the host's row; the
Hosts page shows them for the joined host as it does for the panel's own. Real Docker and a
live panel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings

from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.containers import EngineRuntime
from appliance.runtime.remote_agent import RemoteAgent
from appliance.runtime.strays import MAX_STRAYS, strays_found
from tests.conftest_docker import (  # noqa: F401
    TEST_LABEL,
    TEST_SESSION,
    docker_client,
    test_engine_image,
    unique_id,
    wait_for,
)
from web.deployments.services.installation import instance_id
from web.fleet import services
from web.fleet.models import FleetHost

from .hosts import joined, remote_agent_running, report

HOST = "gpu-s"


def _heartbeat(body: dict[str, Any], credential: str) -> tuple[int, dict[str, Any]]:
    answer = Client().post("/api/fleet/host/heartbeat/", json.dumps(body),
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {credential}")
    return answer.status_code, answer.json()


STRAY = {"name": "appliance-engine-0123abcd-7-old", "status": "running",
         "labels": {"appliance.deployment": "7", "appliance.managed": "1",
                    "appliance.instance": "0123456789abcdef", "appliance.start-token": "old"}}


@pytest.mark.django_db
def test_a_heartbeats_strays_are_stored_and_one_without_them_keeps_the_rows() -> None:
    done = joined(HOST)
    assert _heartbeat(report(foreign_containers=[STRAY]), done.credential)[0] == 200
    assert FleetHost.objects.get(name=HOST).foreign_containers == [STRAY]
    # An older agent (or one another process of the host holds) sends none: kept.
    assert _heartbeat(report(), done.credential)[0] == 200
    assert FleetHost.objects.get(name=HOST).foreign_containers == [STRAY]
    assert _heartbeat(report(foreign_containers=[]), done.credential)[0] == 200
    assert FleetHost.objects.get(name=HOST).foreign_containers == []


@pytest.mark.django_db
@pytest.mark.parametrize("sent", [
    "appliance-engine-1",
    [{"name": "x", "status": "running"}],
    [{**STRAY, "labels": {"com.example.other": "1"}}],
    [{**STRAY, "labels": {"appliance.deployment": 7}}],
    [{**STRAY, "name": ""}],
    [{**STRAY, "secret": "s"}],
    [STRAY] * (MAX_STRAYS + 1),
])
def test_a_bad_stray_list_is_a_400_naming_the_field_and_stores_nothing(sent: Any) -> None:
    done = joined(HOST)
    status, body = _heartbeat(report(foreign_containers=sent), done.credential)
    assert status == 400 and list(body) == ["foreign_containers"], body
    assert "name, status and labels" in body["foreign_containers"][0]
    assert FleetHost.objects.get(name=HOST).foreign_containers == []


def _labelled(client: Any, image: str, labels: dict[str, str]) -> Any:
    return client.containers.run(
        image, ["sleep", "600"], entrypoint=[], detach=True, name=unique_id("stray"),
        labels={"appliance.managed": "1", TEST_LABEL: TEST_SESSION, **labels})


@pytest.mark.docker
def test_an_engine_placed_here_is_no_stray_and_anything_else_labelled_is(
        docker_client, test_engine_image: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    mine = "i" * 16
    placed = _labelled(docker_client, test_engine_image, {
        "appliance.deployment": "41", "appliance.instance": mine,
        "appliance.start-token": "now"})
    old_start = _labelled(docker_client, test_engine_image, {
        "appliance.deployment": "41", "appliance.instance": mine,
        "appliance.start-token": "before"})
    other_install = _labelled(docker_client, test_engine_image, {
        "appliance.deployment": "41", "appliance.instance": "o" * 16,
        "appliance.start-token": "now", "com.example.owner": "someone"})
    try:
        found = strays_found(EngineRuntime(), instance=mine, owned={("41", "now")})
        names = {s["name"] for s in found}
        assert placed.name not in names
        assert {old_start.name, other_install.name} <= names
        shown = next(s for s in found if s["name"] == other_install.name)
        assert shown["status"] == "running" and "com.example.owner" not in shown["labels"]
        assert shown["labels"]["appliance.instance"] == "o" * 16
    finally:
        for container in (placed, old_start, other_install):
            container.remove(force=True)


@pytest.fixture
def fleet_host(live_server, tmp_path: Path, docker_client  # noqa: F811
               ) -> Iterator[RemoteAgent]:  # type: ignore[no-untyped-def]
    """A joined host's agent against the live panel, beating every second."""
    config = RemoteSettings(
        panel_url=live_server.url, host_name=HOST, advertise_addr="127.0.0.1",
        join_token=services.jointoken_create(host_name=HOST).secret,
        credential_path=tmp_path / "host-credential", gpu_requests=False, gpu_check=False,
        tick_s=0.2)
    with override_settings(FLEET_HEARTBEAT_S=1), remote_agent_running(config) as (agent, _):
        yield agent


def _reported(name: str) -> bool:
    row = FleetHost.objects.get(name=HOST)
    return any(c["name"] == name for c in row.foreign_containers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_a_joined_hosts_stray_is_reported_warned_of_and_shown_on_the_hosts_page(
        fleet_host, docker_client, test_engine_image, admin, caplog) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A container of this install, of a deployment no longer placed here (its start
    token old): the host's agent names it in its heartbeat, warns once, and the Hosts page
    shows it on the joined host's card with how to remove it; never stopped."""
    stray = _labelled(docker_client, test_engine_image, {
        "appliance.deployment": "7", "appliance.instance": instance_id(),
        "appliance.start-token": "old"})
    try:
        with caplog.at_level("WARNING"):
            wait_for(lambda: _reported(str(stray.name)), timeout_s=20, every_s=0.2)
            wait_for(lambda: any(stray.name in r.getMessage() for r in caplog.records),
                     timeout_s=10, every_s=0.2)
        warning = next(r.getMessage() for r in caplog.records if stray.name in r.getMessage())
        assert "docker rm -f" in warning and "never adopted or stopped" in warning
        row = FleetHost.objects.get(name=HOST)
        assert row.joined_at is not None  # the joined host's own row, not the panel's
        listed = next(c for c in row.foreign_containers if c["name"] == stray.name)
        assert listed["status"] == "running"
        assert listed["labels"]["appliance.start-token"] == "old"
        client = Client()
        client.force_login(admin)
        page = client.get("/hosts/").content.decode()
        card = page[page.index(f'id="host-gpus-{HOST}"'):]
        card = card[:card.index("</section>")]
        assert stray.name in card and "never adopted or stopped" in card
        assert "docker rm -f" in card
        stray.reload()
        assert stray.status == "running", "a stray is never stopped"
    finally:
        stray.remove(force=True)
    # Gone from the host, gone from the next heartbeat's list.
    wait_for(lambda: not _reported(str(stray.name)), timeout_s=20, every_s=0.2)
    assert fleet_host.refused is None
