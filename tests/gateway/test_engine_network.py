"""Under compose the agent puts the web service on the engine network (web has no Docker
socket), so the gateway reaches engines by container name: compose's labels find it."""

from __future__ import annotations

import contextlib

import pytest

import docker
from appliance.runtime.container_plan import COMPOSE_PROJECT, COMPOSE_SERVICE
from appliance.runtime.containers import EngineRuntime
from tests.conftest_docker import TEST_LABELS, docker_client, test_engine_image, unique_id  # noqa: F401

pytestmark = pytest.mark.docker


def test_the_agent_finds_its_projects_web_container_and_connects_it(docker_client, test_engine_image) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    project, other = unique_id("gwproj"), unique_id("gwother")
    started = []

    def run(proj: str, service: str):  # type: ignore[no-untyped-def]
        container = docker_client.containers.run(
            test_engine_image, detach=True, labels={**TEST_LABELS, COMPOSE_PROJECT: proj,
                                                    COMPOSE_SERVICE: service})
        started.append(container)
        return container

    runtime = EngineRuntime(docker_client)
    network = runtime.ensure_network(unique_id("gwnet"))
    try:
        agent, web, stranger = run(project, "agent"), run(project, "web"), run(other, "web")
        assert runtime.compose_peers(agent.id, "web") == [web.id]
        assert runtime.compose_peers(unique_id("no-such-container"), "web") == []
        assert runtime.join_network(network, web.id)
        assert runtime.join_network(network, web.id)  # again: already there, no second connect
        network.reload()
        members = {c.id for c in network.containers}
        assert web.id in members and stranger.id not in members
    finally:
        for container in started:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        network.remove()
