"""Shared Docker fixtures: a real daemon, the test engine image, containers cleaned up.

Import the fixtures you use into a test module (or a conftest):

    from tests.conftest_docker import docker_client, run_test_engine  # noqa: F401

Tests skip only when no Docker daemon answers; a missing base image or a failed build
is an error, not a skip. The test engine is a test stand-in for SGLang, never a product
feature (docker/test-engine/README.md).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests
from docker.client import DockerClient, from_env
from docker.models.containers import Container

REPO = Path(__file__).resolve().parent.parent
TEST_ENGINE_DIR = REPO / "docker" / "test-engine"
TEST_ENGINE_IMAGE = os.environ.get("APPLIANCE_TEST_ENGINE_IMAGE", "appliance-test-engine:latest")
BASE_IMAGE = os.environ.get("APPLIANCE_BASE_IMAGE", "appliance-base:bookworm")
# Every container a test starts carries this label; its value names the test session, so
# a session's teardown removes its own strays and never another session's containers (other
# engineers' and CI jobs' test runs share this Docker engine).
TEST_LABEL = "appliance.test"
TEST_SESSION = uuid.uuid4().hex[:12]
TEST_LABELS = {TEST_LABEL: TEST_SESSION}
FAST_ENV = {"TEST_ENGINE_PACE_S": "0.01"}


def ddtree_argv(port: int = 30000, tp: int = 2, max_bs: int = 16) -> list[str]:
    """The real DDTree launch argv (as appliance.engine.launch.launch_args builds it), small TP."""
    return [
        "python3", "-m", "sglang.launch_server",
        "--model-path", "/models/kimi-k2.6", "--tp-size", str(tp), "--trust-remote-code",
        "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", "/models/kimi-k2.6-dflash",
        "--speculative-num-draft-tokens", "8", "--speculative-ddtree-budget", "32",
        "--attention-backend", "fa3", "--cuda-graph-max-bs", str(max_bs),
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
        "--host", "0.0.0.0", "--port", str(port), "--enable-metrics",
    ]


def unique_id(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(predicate: Callable[[], Any], timeout_s: float = 20, every_s: float = 0.05) -> Any:
    """Poll until predicate() is truthy; fail the test with a clear message on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"condition not met within {timeout_s}s: {predicate}")


def host_port(container: Container, container_port: int = 30000) -> int:
    def published() -> str | None:
        container.reload()
        bindings = (container.attrs["NetworkSettings"]["Ports"] or {}).get(
            f"{container_port}/tcp") or []
        return bindings[0]["HostPort"] if bindings else None

    return int(wait_for(published, 10))


def health_code(url: str) -> int:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code
    except requests.RequestException:
        return 0


def remove_labelled(client: DockerClient, label: str | list[str]) -> None:
    """Remove the containers carrying every one of these labels (`key` or `key=value`)."""
    for container in client.containers.list(all=True, filters={"label": label},
                                            ignore_removed=True):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def engines_of(instance: str, deployment: int | str | None = None) -> list[Container]:
    """The engine containers the appliance started for this install (its instance id), any
    state; of one deployment when given. Deployment ids repeat across the databases of
    test runs beside this one, so a test never lists by the deployment label alone."""
    labels = ["appliance.deployment", f"appliance.instance={instance}"]
    if deployment is not None:
        labels[0] = f"appliance.deployment={deployment}"
    return list(from_env().containers.list(all=True, filters={"label": labels},
                                           ignore_removed=True))


def remove_engines(instance: str) -> None:
    """Remove this install's engine containers, and no other install's: a test's teardown
    must leave the engines of a compose run or another test session alone."""
    for container in engines_of(instance):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[DockerClient]:
    """A client for the real Docker daemon; skips the test when none answers."""
    try:
        client = from_env()
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        pytest.skip(f"no Docker daemon: {exc}")
    yield client
    remove_labelled(client, f"{TEST_LABEL}={TEST_SESSION}")  # this session's strays only
    client.close()


def ensure_base_image(client: DockerClient) -> None:
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        # Idempotent; debootstraps once. Another process may be running it already.
        subprocess.run(["bash", str(REPO / "docker/base/make-base-image.sh"), BASE_IMAGE],
                       check=True, cwd=REPO)


def build_test_engine_image(client: DockerClient) -> str:
    """Build the test engine image with its own script (docker/test-engine/build.sh: the
    docker/ context plus the real-engine recordings it replays; layer cache keeps it fast)."""
    ensure_base_image(client)
    done = subprocess.run(["bash", str(TEST_ENGINE_DIR / "build.sh"), TEST_ENGINE_IMAGE,
                           BASE_IMAGE], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building {TEST_ENGINE_IMAGE} failed: {done.stderr[-2000:]}")
    return TEST_ENGINE_IMAGE


@pytest.fixture(scope="session")
def test_engine_image(docker_client: DockerClient) -> str:
    """The test engine image, built once per session from docker/test-engine."""
    return build_test_engine_image(docker_client)


@pytest.fixture
def run_test_engine(
    docker_client: DockerClient, test_engine_image: str
) -> Iterator[Callable[..., Container]]:
    """Start test engine containers (port published on loopback); all removed afterwards."""
    started: list[Container] = []

    def run(argv: list[str] | None = None, env: dict[str, str] | None = None) -> Container:
        container = docker_client.containers.run(
            test_engine_image, command=argv or ddtree_argv(), detach=True,
            environment={**FAST_ENV, **(env or {})}, labels=dict(TEST_LABELS),
            ports={"30000/tcp": ("127.0.0.1", None)},
        )
        started.append(container)
        return container

    yield run
    for container in started:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
