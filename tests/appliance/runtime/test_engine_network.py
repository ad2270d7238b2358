"""join_engine_network (Docker only, no Django): the agent's and the worker's start under
compose. It makes the closed engine network, puts the calling container on it and the
relay services of the same compose project (web, the gateways), no other project's; no
network named: nothing is made."""

from __future__ import annotations

import contextlib

import pytest

import docker
from appliance.runtime import engine_network
from appliance.runtime.container_plan import COMPOSE_PROJECT, COMPOSE_SERVICE
from appliance.runtime.containers import EngineRuntime, network_is_closed
from tests.conftest_docker import TEST_LABELS, docker_client, test_engine_image, unique_id  # noqa: F401

pytestmark = pytest.mark.docker


def test_the_agent_joins_the_closed_network_with_its_projects_relays_only(  # type: ignore[no-untyped-def]
        docker_client, test_engine_image, monkeypatch) -> None:  # noqa: F811
    project, other, name = unique_id("enproj"), unique_id("enother"), unique_id("ennet")
    started = []

    def run(proj: str, service: str):  # type: ignore[no-untyped-def]
        container = docker_client.containers.run(
            test_engine_image, ["sleep", "600"], entrypoint=[], detach=True,
            labels={**TEST_LABELS, COMPOSE_PROJECT: proj, COMPOSE_SERVICE: service})
        started.append(container)
        return container

    runtime = EngineRuntime(docker_client)
    networks_before = {n.name for n in docker_client.networks.list()}
    assert engine_network.join_engine_network(runtime, "") == ""
    assert {n.name for n in docker_client.networks.list()} == networks_before
    try:
        agent, web, gateway = run(project, "agent"), run(project, "web"), run(project, "gateway-a")
        worker, stranger = run(project, "worker"), run(other, "web")
        # As if called inside the agent's container (its hostname is its id's start).
        monkeypatch.setattr(engine_network.socket, "gethostname", lambda: agent.id[:12])
        assert engine_network.join_engine_network(runtime, name) == ""
        network = docker_client.networks.get(name)
        assert network_is_closed(network.attrs)
        members = {c.id for c in network.containers}
        assert members == {agent.id, web.id, gateway.id}, "not the worker, nor another project's"
        assert worker.id not in members and stranger.id not in members
    finally:
        for container in started:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.networks.get(name).remove()
