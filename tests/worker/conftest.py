import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from appliance.runtime.agent_settings import RemoteSettings, join_token_read
from appliance.runtime.remote_agent import RemoteAgent
from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401
from tests.fleet.hosts import remote_agent_running
from tests.servers import bridge_address, own_host_token


@contextlib.contextmanager
def own_agent(panel_url: str, state_dir: Path, **changes: Any) -> Iterator[RemoteAgent]:
    """The panel's own host's agent: the fleet's agent program (appliance.runtime.
    remote_agent), as compose runs it, ticking on a thread of the test process against the
    live panel. It joins with the own host's token as the panel loop keeps it in its file,
    takes this process's engine settings (compose gives the panel's to it) and `changes`,
    and publishes its engines on this machine's address on Docker's bridge."""
    token_file = own_host_token(state_dir)
    config = RemoteSettings(**{
        "panel_url": panel_url, "host_name": str(settings.HOST_NAME),
        "advertise_addr": bridge_address(),
        "join_token": join_token_read(token_file, wait_s=5),
        "credential_path": state_dir / "host-credential",
        "gpu_requests": bool(settings.ENGINE_GPU_REQUESTS),
        "gpu_check": bool(settings.ENGINE_GPU_CHECK), "gpu_count": int(settings.GPU_COUNT),
        "extra_env": dict(settings.ENGINE_EXTRA_ENV),
        "stop_timeout_s": int(settings.ENGINE_STOP_TIMEOUT_S), "ready_timeout_s": 90,
        "secrets_dir": str(settings.ENGINE_SECRETS_DIR), "models_dir": str(settings.MODELS_DIR),
        "tick_s": 0.2, **changes})
    with remote_agent_running(config) as (agent, _):
        yield agent


@pytest.fixture
def agent(live_server, tmp_path: Path) -> Iterator[RemoteAgent]:  # type: ignore[no-untyped-def]
    """The panel's own host's agent (own_agent) against the live panel."""
    with own_agent(live_server.url, tmp_path) as running:
        yield running
