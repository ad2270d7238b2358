"""The local images docker/base/make-local-images.sh makes for machines without a registry
stand in for python:3.x-slim, redis:7-alpine and postgres:16-alpine the way compose.yaml and
docker/panel/Dockerfile use them. Each image runs for real, with docker-py; the tests talk to
it over a port published on 127.0.0.1, as the host would.

The tags come from APPLIANCE_PYTHON_IMAGE / APPLIANCE_REDIS_IMAGE / APPLIANCE_POSTGRES_IMAGE,
so the same tests hold the official images to the same contract where a registry exists.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import psycopg
import pytest
import redis
from docker.client import DockerClient
from docker.models.containers import Container

from tests.conftest_docker import TEST_LABEL, host_port, unique_id

pytestmark = pytest.mark.docker

PYTHON_IMAGE = os.environ.get("APPLIANCE_PYTHON_IMAGE", "appliance-python:bookworm")
REDIS_IMAGE = os.environ.get("APPLIANCE_REDIS_IMAGE", "appliance-redis:bookworm")
POSTGRES_IMAGE = os.environ.get("APPLIANCE_POSTGRES_IMAGE", "appliance-postgres:bookworm")
PGDATA = "/var/lib/postgresql/data"
PASSWORD = "s3cret pass-word"  # a space, as real ones may have
LOOPBACK = ("127.0.0.1", None)  # a free port on the host's loopback


class Sandbox:
    """Containers and volumes for one test; all removed afterwards (containers first)."""

    def __init__(self, client: DockerClient) -> None:
        self.client = client
        self.containers: list[Container] = []
        self.volumes: list[str] = []

    def run(self, image: str, **kwargs: Any) -> Container:
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.skip(f"image {image} not found: make it with "
                        "`bash docker/base/make-local-images.sh` (tests/setup-and-run.sh does)")
        container = self.client.containers.run(
            image, detach=True, labels={TEST_LABEL: "1"}, **kwargs)
        self.containers.append(container)
        return container

    def volume(self) -> str:
        name = unique_id("base-images")
        self.client.volumes.create(name, labels={TEST_LABEL: "1"})
        self.volumes.append(name)
        return name

    def close(self) -> None:
        for container in self.containers:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)  # v: anonymous volumes (VOLUME) too
        for name in self.volumes:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.volumes.get(name).remove(force=True)


@pytest.fixture
def sandbox(docker_client: DockerClient) -> Iterator[Sandbox]:
    box = Sandbox(docker_client)
    yield box
    box.close()


def until_up(container: Container, probe: Callable[[], Any], timeout_s: float = 60) -> Any:
    """Poll probe() until truthy; fail at once with the logs if the container exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        container.reload()
        if container.status == "exited" or time.monotonic() > deadline:
            logs = container.logs().decode(errors="replace")[-4000:]
            pytest.fail(f"{container.image.tags} not up ({container.status}):\n{logs}")
        time.sleep(0.2)


def stopped_cleanly(container: Container, signal: str | None = None) -> str:
    """Stop the container (`docker stop`, or one signal) and return its logs; exit code 0."""
    if signal:
        container.kill(signal=signal)
    else:
        container.stop(timeout=20)
    status = container.wait(timeout=30)["StatusCode"]
    logs: str = container.logs().decode(errors="replace")
    assert status == 0, logs[-4000:]
    return logs


def exec_ok(container: Container, argv: list[str]) -> str:
    result = container.exec_run(argv)
    output: str = result.output.decode(errors="replace")
    assert result.exit_code == 0, f"{argv}: {output}"
    return output


# --- python ---------------------------------------------------------------------------------

def test_python_image_has_python_pip_and_venv(sandbox: Sandbox) -> None:
    # `pip install` into the system Python must not be refused (PEP 668), as in python:3.x.
    script = ("python --version && python3 -m venv /tmp/venv"
              " && python3 -m pip install --no-index pip")
    container = sandbox.run(PYTHON_IMAGE, network_mode="none", command=["sh", "-c", script])
    status = container.wait(timeout=60)["StatusCode"]
    logs = container.logs().decode(errors="replace")
    assert status == 0, logs
    assert "Requirement already satisfied: pip" in logs


# --- redis ----------------------------------------------------------------------------------

def redis_client(container: Container) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=host_port(container, 6379), socket_timeout=3)


def pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_redis_runs_the_compose_command_and_keeps_data_in_its_volume(sandbox: Sandbox) -> None:
    data = sandbox.volume()
    compose_like: dict[str, Any] = {
        "command": ["redis-server", "--appendonly", "yes"],
        "ports": {"6379/tcp": LOOPBACK},
        "volumes": {data: {"bind": "/data", "mode": "rw"}},
    }
    first = sandbox.run(REDIS_IMAGE, **compose_like)
    client = redis_client(first)
    # From the host, through the published port, the client is not on the container's
    # loopback: this PING is refused if protected mode is on.
    until_up(first, lambda: pings(client))
    assert client.config_get("protected-mode") == {"protected-mode": "no"}
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert exec_ok(first, ["redis-cli", "ping"]).strip() == "PONG"  # the healthcheck
    assert exec_ok(first, ["cat", "/proc/1/comm"]).strip() == "redis-server"  # PID 1
    client.set("appliance:test", "kept")
    client.close()
    assert "ready to exit" in stopped_cleanly(first)

    second = sandbox.run(REDIS_IMAGE, **compose_like)
    client = redis_client(second)
    until_up(second, lambda: pings(client))
    assert client.get("appliance:test") == b"kept"
    client.close()


def test_redis_default_command_listens_for_other_containers(sandbox: Sandbox) -> None:
    container = sandbox.run(REDIS_IMAGE, ports={"6379/tcp": LOOPBACK})
    client = redis_client(container)
    until_up(container, lambda: pings(client))
    assert exec_ok(container, ["pwd"]).strip() == "/data"
    client.close()


# --- postgres -------------------------------------------------------------------------------

def pg_connect(port: int, password: str) -> psycopg.Connection[Any]:
    return psycopg.connect(host="127.0.0.1", port=port, user="appliance", password=password,
                           dbname="appliance", connect_timeout=5)


def accepts(port: int, password: str) -> bool:
    try:
        pg_connect(port, password).close()
    except psycopg.OperationalError:
        return False
    return True


def test_postgres_initialises_once_and_keeps_its_data(sandbox: Sandbox, tmp_path: Path) -> None:
    # A secret file only its owner (root) may read, with a trailing newline, mounted
    # read-only: what compose `secrets:` or a mounted file gives the entrypoint.
    secret = tmp_path / "pg_password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    data = sandbox.volume()
    first = sandbox.run(
        POSTGRES_IMAGE,
        environment={"POSTGRES_USER": "appliance", "POSTGRES_DB": "appliance",
                     "POSTGRES_PASSWORD_FILE": "/run/secrets/pg_password"},
        ports={"5432/tcp": LOOPBACK},
        volumes={data: {"bind": PGDATA, "mode": "rw"},
                 str(secret): {"bind": "/run/secrets/pg_password", "mode": "ro"}},
    )
    port = host_port(first, 5432)
    until_up(first, lambda: accepts(port, PASSWORD))

    with pg_connect(port, PASSWORD) as conn:
        row = conn.execute("SELECT current_user, current_database(), rolsuper "
                           "FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row == ("appliance", "appliance", True)
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('survives a restart')")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        pg_connect(port, "not-the-password")
    assert "accepting connections" in exec_ok(first, ["pg_isready", "-U", "appliance"])
    assert exec_ok(first, ["cat", "/proc/1/comm"]).strip() == "postgres"  # PID 1, signals
    assert exec_ok(first, ["stat", "-c", "%U %a", PGDATA]).strip() == "postgres 700"
    # SIGTERM (what a plain `kill` or an init sends) shuts down cleanly too.
    assert "database system is shut down" in stopped_cleanly(first, "SIGTERM")

    # A new container on the same volume, with another password: the data directory is
    # used as it is, so the first password still holds and the second does not.
    second = sandbox.run(
        POSTGRES_IMAGE,
        environment={"POSTGRES_USER": "appliance", "POSTGRES_DB": "appliance",
                     "POSTGRES_PASSWORD": "another-password"},
        ports={"5432/tcp": LOOPBACK},
        volumes={data: {"bind": PGDATA, "mode": "rw"}},
    )
    port = host_port(second, 5432)
    until_up(second, lambda: accepts(port, PASSWORD))
    assert not accepts(port, "another-password")
    with pg_connect(port, PASSWORD) as conn:
        assert conn.execute("SELECT note FROM kept").fetchall() == [("survives a restart",)]
    logs = stopped_cleanly(second)  # `docker stop`: the image's stop signal
    assert "Skipping initialization" in logs
    assert "database system is shut down" in logs


def test_postgres_refuses_to_initialise_without_a_password(sandbox: Sandbox) -> None:
    container = sandbox.run(POSTGRES_IMAGE, environment={"POSTGRES_USER": "appliance"})
    assert container.wait(timeout=60)["StatusCode"] != 0
    assert "superuser password is not specified" in container.logs().decode()
