"""A planted secret reaches its engine and nothing else: real panel, Celery worker, engine
agent, PostgreSQL, Redis and Docker, searched everywhere a value could end up.

The value is put into the engine container as a file and exported by the image's
entrypoint (appliance/runtime/secrets.py); the test engine reports only its SHA-256.
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.conf import settings
from django.test import override_settings

import docker
from appliance.runtime.container_plan import Identity
from tests.conftest_docker import remove_engines
from tests.servers import (
    celery_worker,
    login_session,
    own_host_agent,
    panel_server,
    suite_database_url,
)
from tests.specs import spec
from tests.waiting import wait_for_status
from web.accounts.tokens import token_create
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus


@pytest.fixture
def planted(tmp_path: Path) -> str:
    value = "hf_" + secrets.token_urlsafe(24)
    store = tmp_path / "secrets"
    store.mkdir()
    (store / "HF_TOKEN").write_text(value + "\n")
    return value


@pytest.fixture
def stack(test_engine_image: str, tmp_path: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    """Panel, worker and agent as separate processes, each logging to tmp_path."""
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_SECRETS_DIR": str(tmp_path / "secrets"),
           "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5", "APPLIANCE_ENGINE_READY_TIMEOUT_S": "120"}
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False,
                           ENGINE_SECRETS_DIR=env["APPLIANCE_ENGINE_SECRETS_DIR"]), \
            panel_server(tmp_path / "panel.log", **env) as url, \
            celery_worker(tmp_path / "worker.log", **env), \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env):
        yield {"url": url, "logs": tmp_path}
    remove_engines(instance_id())  # this database's engines only, never another run's


def _engine_address(container: Any) -> str:
    """Where the engine's port is published (the host's advertised address, and port)."""
    bound = container.attrs["NetworkSettings"]["Ports"]["30000/tcp"][0]
    return f"{bound['HostIp'] or '127.0.0.1'}:{bound['HostPort']}"


def _container_checks(pk: int, value: str) -> dict[str, str]:
    """What the running engine's container shows: the engine sees the value (by hash);
    `docker inspect` and the image's history do not; the file is gone."""
    row = Deployment.objects.get(pk=pk)
    name = Identity(str(pk), instance_id(), row.start_token).name
    container = docker.from_env().containers.get(name)
    info = requests.get(f"http://{_engine_address(container)}/server_info", timeout=10)
    seen = info.json()["secrets_seen"]
    assert seen == {"HF_TOKEN": hashlib.sha256(value.encode()).hexdigest()}
    left = container.exec_run(["ls", "-A", "/run/appliance/secrets"]).output.decode()
    assert left.strip() == "", "the entrypoint removed the file"
    return {
        "docker inspect": _run(["docker", "inspect", name]),
        "docker history": _run(["docker", "history", "--no-trunc", container.image.id]),
        "docker logs": container.logs().decode(errors="replace"),
        "engine /server_info": info.text,
    }


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def _api_and_stream(url: str, pk: int) -> dict[str, str]:
    """The events through the API (a viewer's token) and the SSE stream (its session)."""
    _, token = token_create(username="vera")
    auth = {"Authorization": f"Token {token}"}
    found = {path: requests.get(f"{url}{path}", headers=auth, timeout=10).text
             for path in ("/api/deployments/", f"/api/deployments/{pk}/",
                          f"/api/deployments/{pk}/events/?limit=1000",
                          f"/api/deployments/{pk}/summary/")}
    session = login_session(url, "vera", "viewer-pass-1")
    stream = session.get(f"{url}/deployments/{pk}/events/stream/", timeout=30)
    assert stream.status_code == 200 and "data:" in stream.text
    found["SSE stream"] = stream.text
    found["detail page"] = session.get(f"{url}/deployments/{pk}/").text
    return found


def _redis_values() -> dict[str, str]:
    """Every key of the appliance's Redis database, read by type (DUMP may compress)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    readers = {b"string": client.get, b"list": lambda k: client.lrange(k, 0, -1),
               b"hash": client.hgetall, b"set": client.smembers,
               b"zset": lambda k: client.zrange(k, 0, -1), b"stream": client.xrange}
    found = {}
    for key in client.scan_iter("*"):
        kind = client.type(key)
        found[f"redis {key!r}"] = repr(readers.get(kind, client.dump)(key)) + repr(key)
    return found


def _everything_else(logs: Path) -> dict[str, str]:
    dump = _run(["pg_dump", "--data-only", suite_database_url()])
    found = {"pg_dump": dump, **_redis_values()}
    for log in sorted(logs.glob("*.log")):
        found[f"log {log.name}"] = log.read_text(errors="replace")
    return found


def test_a_planted_secret_reaches_its_engine_and_no_event_row_log_key_or_layer(
        planted: str, stack: dict[str, Any], viewer) -> None:  # type: ignore[no-untyped-def]
    # planted first: the agent reports the store's names at its start, and pre-flight
    # refuses a secret the fresh agents do not report.
    pk = deploying.deployment_create(data=spec(secrets=["HF_TOKEN"]), confirm_warnings=True).pk
    assert wait_for_status(pk, {S.READY, S.FAILED}, 150) == S.READY
    places = _container_checks(pk, planted)
    services.deployment_stop(deployment_id=pk)
    assert wait_for_status(pk, {S.STOPPED}, 60) == S.STOPPED
    places.update(_api_and_stream(stack["url"], pk))
    places.update(_everything_else(stack["logs"]))
    assert len(places) >= 14
    leaks = [where for where, text in places.items() if planted in text]
    print(f"\nsecret-leaks: places searched {len(places)}, leaks {len(leaks)}")
    assert leaks == []
