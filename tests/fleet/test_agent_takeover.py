"""One agent process writes for a host (web/fleet/hostapi.py's lease on FleetHost), as the
panel's own agent holds each engine's row (tests/worker/test_faults.py): a host's agent
killed while its engine loads is replaced by a new agent process of the same host, which
takes the engine over only once the killed one's lease has run out, adopts the running
engine (no second container) and ships its log on from the stored cursor, every line once.

The killed agent is `python3 -m worker.agent` in a process of its own (killed with SIGKILL:
no release, its lease runs out); the new one runs as a thread of this process against the
test's live panel, with a copy of the credential the first stored but a state of its own
(another machine's, or a second container's): it has not the host's stored agent session,
which an agent restarted on the same state takes back at once (tests/worker/test_faults.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from appliance.runtime.agent_settings import RemoteSettings
from appliance.runtime.containers import EngineRuntime
from appliance.runtime.host_sink import MASK
from appliance.runtime.panel_link import panel_link_open
from appliance.runtime.remote_agent import RemoteAgent, host_report
from tests.conftest_docker import (  # noqa: F401
    docker_client,
    engines_of,
    remove_engines,
    test_engine_image,
    wait_for,
)
from tests.fleet.simhosts import gateway
from tests.loglines import assert_every_line_once
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from web.fleet import services
from web.fleet.models import FleetHost
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
HOST = "gpu-t"
ROOT = str(Path(__file__).resolve().parents[2])
_KEY = re.compile(r"api_key='[0-9a-f]{64}'")


def _engine_own(lines: list[str]) -> list[str]:
    """The engine's lines as a host ships them: its key masked, the host's own notes out."""
    return [_KEY.sub(f"api_key='{MASK}'", line) for line in lines
            if not line.startswith("appliance: ")]


def _status(pk: int) -> str:
    return str(Deployment.objects.get(pk=pk).status)


def test_a_new_agent_takes_over_a_hosts_engine_only_when_the_old_lease_has_expired(  # type: ignore[no-untyped-def]
        live_server, tmp_path: Path, docker_client, test_engine_image: str) -> None:  # noqa: F811
    advertise = gateway(docker_client.networks.get("bridge"))
    credential = tmp_path / "credential"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPLIANCE_", "DJANGO_"))}
    env.update(APPLIANCE_PANEL_URL=live_server.url, APPLIANCE_HOST_NAME=HOST,
               APPLIANCE_HOST_ADVERTISE_ADDR=advertise,
               APPLIANCE_JOIN_TOKEN=services.jointoken_create(host_name=HOST).secret,
               APPLIANCE_HOST_CREDENTIAL_FILE=str(credential), APPLIANCE_GPU_COUNT="1",
               APPLIANCE_ENGINE_GPU_REQUESTS="0", APPLIANCE_ENGINE_GPU_CHECK="0",
               APPLIANCE_ENGINE_STOP_TIMEOUT_S="5", APPLIANCE_AGENT_TICK_MS="200",
               # Loading takes a few seconds: the kill comes while it loads.
               APPLIANCE_ENGINE_EXTRA_ENV="TEST_ENGINE_PACE_S=0.05,TEST_ENGINE_SHARDS=40",
               DJANGO_SETTINGS_MODULE="no.such.settings")
    stop = threading.Event()
    second: threading.Thread | None = None
    first = subprocess.Popen([sys.executable, "-m", "worker.agent"], env=env, cwd=ROOT,
                             stdout=(tmp_path / "first.log").open("w"),
                             stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: FleetHost.objects.filter(name=HOST).exists() or first.poll() is not None,
                 timeout_s=30)
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False):
            made = deploying.deployment_create(data=spec(name="taken-over"),
                                               confirm_warnings=True)
            services.placement_assign(deployment=made, host_name=HOST, reason="the test's")
            tasks.deploy.apply(args=[made.pk]).get()
            pk = made.pk
            wait_for(lambda: _status(pk) in {S.LOADING, S.READY, S.FAILED}, timeout_s=90,
                     every_s=0.1)
            assert _status(pk) == S.LOADING, Deployment.objects.get(pk=pk).diagnosis
            first.send_signal(signal.SIGKILL)
            first.wait()
            killed = time.monotonic()
            held = FleetHost.objects.get(name=HOST)
            assert held.agent_session and held.agent_lease_until is not None

            elsewhere = tmp_path / "second" / "credential"
            elsewhere.parent.mkdir()
            elsewhere.write_bytes(credential.read_bytes())
            config = RemoteSettings(panel_url=live_server.url, host_name=HOST,
                                    advertise_addr=advertise, credential_path=elsewhere,
                                    gpu_requests=False, gpu_check=False, stop_timeout_s=5,
                                    ready_timeout_s=90, tick_s=0.2,
                                    extra_env={"TEST_ENGINE_PACE_S": "0.05",
                                               "TEST_ENGINE_SHARDS": "40"})
            runtime = EngineRuntime()
            link = panel_link_open(panel_url=config.panel_url,
                                   credential_path=config.credential_path, token="",
                                   name=HOST, report=host_report(runtime, config))
            agent = RemoteAgent(link=link, config=config, runtime=runtime)
            second = threading.Thread(target=agent.run, args=(stop,), daemon=True)
            second.start()
            wait_for(lambda: _status(pk) in {S.READY, S.FAILED}, timeout_s=120, every_s=0.2)
            took = FleetHost.objects.get(name=HOST)
            assert took.agent_session == link.agent_session != held.agent_session
            assert _status(pk) == S.READY, Deployment.objects.get(pk=pk).diagnosis
            assert time.monotonic() - killed >= 10, "not before the 15 s lease ran out"
            assert len(engines_of(instance_id(), pk)) == 1
            assert_every_line_once(pk, printed_as=_engine_own, stored_as=_engine_own)
    finally:
        if first.poll() is None:
            first.kill()
        stop.set()
        if second is not None:
            second.join(timeout=20)
        remove_engines(instance_id())
    # Stopped, the new agent gave the host back: a next one takes it at once.
    released: Any = FleetHost.objects.get(name=HOST).agent_lease_until
    assert released is not None and released <= timezone.now()
