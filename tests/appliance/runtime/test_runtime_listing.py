"""EngineRuntime's container listing on the real Docker daemon while containers go away under
it (a stop, another install's or a test session's cleanup): the listing skips what is gone.

docker-py lists the ids first and then inspects each one; a container removed between the
two used to raise NotFound out of the engine agent's tick (appliance/runtime/containers.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest
from docker.client import DockerClient
from docker.models.containers import Container, ContainerCollection

from appliance.runtime.container_plan import Identity
from appliance.runtime.containers import EngineRuntime
from tests.conftest_docker import (  # noqa: F401 (fixtures)
    BASE_IMAGE,
    TEST_LABELS,
    docker_client,
    ensure_base_image,
    unique_id,
)

pytestmark = pytest.mark.docker


@pytest.fixture
def two_engines(docker_client: DockerClient) -> Iterator[list[Container]]:  # noqa: F811
    """Two created (never started) containers with one deployment's identity labels."""
    ensure_base_image(docker_client)
    identity = Identity(unique_id("listing"))
    made = [docker_client.containers.create(BASE_IMAGE, command=["true"],
                                            labels={**identity.labels(), **TEST_LABELS})
            for _ in range(2)]
    yield made
    for container in made:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def _removing_the_other_first(made: list[Container]) -> tuple[Any, list[str]]:
    """The per-container inspect of a listing, made to remove the other of the two before
    its first inspect, as a cleanup running beside the listing would."""
    real_get = ContainerCollection.get
    removed: list[str] = []

    def get(self: ContainerCollection, container_id: str) -> Container:
        if not removed:
            other = next(c for c in made if c.id != container_id)
            other.remove(force=True)
            removed.append(other.id)
        return real_get(self, container_id)

    return get, removed


def test_a_container_removed_while_it_is_listed_is_skipped_not_an_error(
        docker_client: DockerClient, two_engines: list[Container],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = EngineRuntime(docker_client)
    identity = Identity(two_engines[0].labels["appliance.deployment"])
    get, removed = _removing_the_other_first(two_engines)
    monkeypatch.setattr(ContainerCollection, "get", get)

    found = runtime.find(identity)

    assert len(removed) == 1, "one of the two was removed during the listing"
    assert found is not None and found.id != removed[0]
    assert found.id in {c.id for c in two_engines}


def test_the_agents_managed_listing_survives_a_removal_during_it(
        docker_client: DockerClient, two_engines: list[Container],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = EngineRuntime(docker_client)
    get, removed = _removing_the_other_first(two_engines)
    monkeypatch.setattr(ContainerCollection, "get", get)

    listed = {c.id for c in runtime.list_managed()}

    assert removed, "a container was removed during the listing"
    assert removed[0] not in listed
    # The other one stays listed (other installs' engines may be listed beside it).
    assert {c.id for c in two_engines} - set(removed) <= listed
