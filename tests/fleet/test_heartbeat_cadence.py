"""A joined host's agent beats often enough for the panel's lost threshold: the panel tells
it a heartbeat interval (10 s) and the threshold it judges by (APPLIANCE_AGENT_SILENT_S);
where the threshold is short (the trial's 10 s), a beat every interval exactly would leave
the host `lost`, in the gateway's rotation and on every page, for a moment each cycle."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from appliance.runtime.agent_settings import RemoteSettings
from tests.fleet.hosts import remote_agent_running
from web.fleet import services
from web.fleet.models import FleetHost
from web.fleet.selectors import host_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
HOST = "gpu-beat"
SILENT_S = 3  # the panel's threshold here, below its 10 s heartbeat interval


def test_a_host_never_reads_lost_while_its_agent_runs_with_a_short_threshold(
        live_server: Any, tmp_path: Path) -> None:
    with override_settings(AGENT_SILENT_S=SILENT_S):
        config = RemoteSettings(
            panel_url=live_server.url, host_name=HOST, advertise_addr="127.0.0.1",
            join_token=services.jointoken_create(host_name=HOST).secret,
            credential_path=tmp_path / "host-credential", gpu_requests=False,
            gpu_check=False, tick_s=0.2)
        with remote_agent_running(config) as (agent, _):
            states, ages = [], []
            ends = time.monotonic() + 3 * SILENT_S
            while time.monotonic() < ends:
                host = FleetHost.objects.get(name=HOST)
                now = timezone.now()
                states.append(host_state(host=host, now=now))
                ages.append((now - host.heartbeat_at).total_seconds())
                time.sleep(0.1)
    assert set(states) == {"ready"}, f"oldest heartbeat {max(ages):.1f} s"
    assert agent.heartbeat_s <= SILENT_S / 3, agent.heartbeat_s
    print(f"heartbeat every {agent.heartbeat_s:.1f} s; oldest seen {max(ages):.1f} s "
          f"(lost after {SILENT_S} s)")
