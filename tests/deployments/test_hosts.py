"""Start failures get a diagnosis whose fix fits Docker's own message."""

from __future__ import annotations

import pytest

from appliance.logs.appliance_causes import start_failure


@pytest.mark.parametrize(
    ("docker_message", "cause", "fix_mentions"),
    [
        ('could not select device driver "nvidia" with capabilities: [[gpu]]',
         "no-gpu-runtime", "nvidia-ctk"),
        ("image 'appliance-engine:x' is not on this Docker engine and no registry is used.",
         "image-missing", "appliance build"),
        ("driver failed programming external connectivity on endpoint x: Bind for "
         "127.0.0.1:30000 failed: port is already allocated", "port-in-use", "port"),
        ("network appliance-engines not found", "engine-network-missing", "docker compose up"),
        ("cannot reach the Docker engine: Error while fetching server API version",
         "docker-unreachable", "docker.sock"),
        ("OCI runtime create failed: something new", "engine-start-failed", "docker info"),
    ],
)
def test_a_start_failure_is_diagnosed_with_a_fix_that_fits(
        docker_message: str, cause: str, fix_mentions: str) -> None:
    found = start_failure(docker_message)
    assert found.cause == cause
    assert fix_mentions in found.fix
    assert found.evidence["docker"] == docker_message
