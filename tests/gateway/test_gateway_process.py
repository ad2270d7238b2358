"""The gateway as its own process (web/gateway/asgi.py, compose's gateway-a and gateway-b):
/v1 as the panel answers it, /healthz for the proxy's checks, nothing of the panel; and its
drain: on SIGTERM a new connection is refused at once (the proxy retries it on the other
instance) while a stream under way ends whole, and its in-flight counter reaches Redis."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.conf import settings

from tests.openai_standin import standin
from tests.servers import free_port, process_env
from tests.specs import spec
from web.accesslog import QuietHostAPI
from web.deployments.inflight import inflight_key
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "standin-model"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway(tmp_path: Path, live_channel: Any) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """uvicorn web.gateway.asgi:application as the entrypoint runs it (one process)."""
    port, log_path = free_port(), tmp_path / "gateway.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "web.gateway.asgi:application", "--host",
             "127.0.0.1", "--port", str(port), "--timeout-graceful-shutdown", "30"],
            cwd=ROOT, env=process_env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            try:
                if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.2)
        yield url, proc, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _row(url: str) -> Deployment:
    data = spec(name="alone", engine__served_model_name=MODEL)
    return Deployment.objects.create(name="alone", spec=data, recipe=data["recipe"],
                                     algorithm="NONE", gpus=data["gpus"],
                                     status=DeploymentStatus.READY, engine_url=url)


def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def test_the_gateway_process_serves_v1_alone_and_drains_a_stream_on_sigterm(
        gateway: tuple[str, subprocess.Popen[bytes], Path], operator: Any,
        key_for: Any) -> None:
    url, proc, log_path = gateway
    health = requests.get(f"{url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json() == {"ok": True, "role": "gateway"}
    page = requests.get(f"{url}/api/deployments/", timeout=5)
    assert page.status_code == 404 and page.json()["error"]["code"] == "unknown_url"
    assert requests.get(f"{url}/v1/models", timeout=5).status_code == 401
    with standin() as engine:
        row = _row(engine.url)
        secret = key_for(operator)
        headers = {"Authorization": f"Bearer {secret}"}
        listed = requests.get(f"{url}/v1/models", headers=headers, timeout=10).json()
        assert [m["id"] for m in listed["data"]] == [MODEL]

        engine.pace_s = 0.05  # 60 events over 3 s: under way when the signal comes
        got: dict[str, Any] = {}

        def stream() -> None:
            answer = requests.post(
                f"{url}/v1/chat/completions", headers=headers, stream=True, timeout=30,
                json={"model": MODEL, "max_tokens": 60, "stream": True,
                      "messages": [{"role": "user", "content": "drain me"}]})
            got["status"] = answer.status_code
            got["body"] = b"".join(answer.iter_content(None))

        client = threading.Thread(target=stream)
        client.start()
        deadline = time.monotonic() + 10
        while not engine.seen:
            assert time.monotonic() < deadline, "the stream never reached the engine"
            time.sleep(0.02)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # A new connection is refused within a moment, while the stream goes on.
        while not _refused(url):
            assert time.monotonic() - signalled < 2, "still accepting after SIGTERM"
            time.sleep(0.05)
        assert client.is_alive(), "the stream was still under way when new ones were refused"
        client.join(30)
        # uvicorn ends by raising the signal again once it has shut down (exit -15).
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM), log_path.read_text()[-2000:]
        assert "Finished server process" in log_path.read_text()
    assert got["status"] == 200
    events = [e for e in got["body"].split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]", events[-3:]
    tokens = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert sum(1 for t in tokens if t.get("choices")) == 60, "every token event arrived"
    # The relay's in-flight count went back to 0 before the process ended.
    counter = redis.Redis.from_url(settings.REDIS_URL).get(inflight_key(deployment_id=row.pk))
    assert counter in (None, b"0"), counter


def _record(path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                             '%s - "%s %s HTTP/%s" %d',
                             ("10.0.0.2:5000", "GET", path, "1.1", status), None)


def test_the_access_log_leaves_out_the_hosts_successful_api_calls() -> None:
    quiet = QuietHostAPI()
    assert not quiet.filter(_record("/api/fleet/host/", 200))
    assert not quiet.filter(_record("/api/fleet/host/heartbeat/?x=1", 204))
    assert quiet.filter(_record("/api/fleet/host/", 401)), "a refused host call is kept"
    assert quiet.filter(_record("/api/fleet/host/events/", 500))
    assert quiet.filter(_record("/api/deployments/", 200)), "every other path is kept"
    assert quiet.filter(_record("/v1/chat/completions", 200))
