"""Gateway fixtures: a real test engine container started from the spec's own launch argv,
a ready deployment row that points at it, the panel under uvicorn, keys made by the service."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import docker
from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from tests.conftest_docker import (  # noqa: F401
    FAST_ENV,
    TEST_LABELS,
    docker_client,
    host_port,
    test_engine_image,
    wait_for,
)
from tests.servers import panel_server
from tests.specs import spec
from web.deployments.models import Deployment, DeploymentStatus
from web.gateway.services import apikey_create


@pytest.fixture
def panel(tmp_path: Path, live_channel) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with panel_server(tmp_path / "uvicorn.log") as url:
        yield url


@pytest.fixture(scope="module")
def engines(docker_client, test_engine_image):  # type: ignore[no-untyped-def]  # noqa: F811
    """Test engine containers, one per spec and module: each runs the argv
    appliance.engine.launch makes of its spec, so --served-model-name is the product's."""
    started: dict[str, Any] = {}

    def url_for(data: dict[str, Any]) -> str:
        argv = launch_args(spec_from_dict(data)).argv
        key = " ".join(argv)
        if key not in started:
            started[key] = docker_client.containers.run(
                test_engine_image, command=argv, detach=True, environment=dict(FAST_ENV),
                labels=dict(TEST_LABELS), ports={"30000/tcp": ("127.0.0.1", None)})
        url = f"http://127.0.0.1:{host_port(started[key])}"
        wait_for(lambda: _healthy(url), timeout_s=90)
        return url

    yield url_for
    for container in started.values():
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


@pytest.fixture
def engine_for(engines) -> Callable[..., tuple[Deployment, str]]:  # type: ignore[no-untyped-def]
    """A deployment row in `status` whose engine is a real test engine; (row, engine URL)."""

    def make(name: str = "chatty", status: str = DeploymentStatus.READY,
             **changes: Any) -> tuple[Deployment, str]:
        data = spec(name=name, **changes)
        url = engines(data)
        deployment = Deployment.objects.create(
            name=name, spec=data, recipe=data["recipe"], algorithm="DDTREE",
            gpus=data["gpus"], status=status, engine_url=url)
        return deployment, url

    return make


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture
def key_for() -> Callable[..., str]:
    """A new key's secret (as shown once) for a user."""

    def make(user: Any, deployments: list[Deployment] | None = None,
             rate_limit_per_minute: int | None = None, name: str = "test key") -> str:
        return apikey_create(
            owner_username=user.username, name=name,
            deployment_ids=None if deployments is None else [d.pk for d in deployments],
            rate_limit_per_minute=rate_limit_per_minute).secret

    return make
