"""Two simulated GPU hosts (docker/sim-host: each a container with its own Docker engine and
the host's agent, on its own network) join a live panel with join tokens made in it, report
their GPUs and heartbeat; one paused (a partition) is `lost` on the Fleet page after the
stated time and `ready` again once it returns; a killed agent comes back on the credential
it kept, without joining again. Chromium reads the Fleet page as a user does."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from playwright.sync_api import Page, expect

from tests.e2e.screenshots import screenshot_path
from tests.e2e.stack import login
from tests.fleet.simhosts import gateway, host_networks, sim_host_image, sim_hosts
from tests.servers import panel_server
from web.fleet import services
from web.fleet.models import JoinToken

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

NAMES = ["sim-a", "sim-b"]
SILENT_S = 15  # APPLIANCE_AGENT_SILENT_S here: the Fleet page's stated lost time
HEARTBEAT_S = 10  # how often a host's agent reports (APPLIANCE_FLEET_HEARTBEAT_S, web/settings.py)


@pytest.fixture(scope="session")
def sim_image(docker_client: Any) -> str:
    return sim_host_image(docker_client)


# Made before the page: Playwright's loop makes the ORM refuse in the test's own thread.
@pytest.fixture
def tokens(operator: Any) -> dict[str, str]:
    return {name: services.jointoken_create(host_name=name).secret for name in NAMES}


@pytest.fixture
def panel(docker_client: Any, tmp_path: Path) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """The panel on every address of this machine, allowed by the hosts' gateways."""
    networks = host_networks(docker_client, NAMES)
    allowed = ",".join(["localhost", "127.0.0.1", *(gateway(n) for n in networks.values())])
    with panel_server(tmp_path / "web.log", bind="0.0.0.0", APPLIANCE_ALLOWED_HOSTS=allowed,
                      APPLIANCE_AGENT_SILENT_S=str(SILENT_S)) as url:
        yield url, int(url.rsplit(":", 1)[1]), networks


def _uses(name: str) -> int:
    """How often the host's join token was used (read in a thread of its own)."""
    found: list[int] = []

    def read() -> None:
        try:
            found.append(JoinToken.objects.get(host_name=name).uses)
        finally:
            connection.close()
    thread = threading.Thread(target=read)
    thread.start()
    thread.join(30)
    return found[0]


def _state(page: Page, name: str) -> str:
    """The host's state on a fresh load; "absent" before it has joined (no row yet)."""
    page.reload()
    status = page.locator(f"#fleet-host-{name} .state .status")
    return status.inner_text() if status.count() else "absent"


def _wait_state(page: Page, name: str, state: str, timeout_s: float) -> float:
    started = time.monotonic()
    while (now := _state(page, name)) != state:
        assert time.monotonic() - started < timeout_s, f"{name} is {now}, not {state}"
        time.sleep(1)
    return time.monotonic() - started


def test_simulated_hosts_join_and_a_paused_one_is_lost_until_it_returns(
        docker_client: Any, sim_image: str, tokens: dict[str, str],
        panel: tuple[str, int, dict[str, Any]], page: Page) -> None:
    url, port, networks = panel
    with sim_hosts(docker_client, sim_image, tokens, networks=networks,
                   panel_port=port) as hosts:
        login(page, url)
        page.goto(f"{url}/fleet/")
        expect(page.locator("main")).to_contain_text(f"has not reported for {SILENT_S} s")
        for name in NAMES:
            _wait_state(page, name, "ready", 90)
            row = page.locator(f"#fleet-host-{name}")
            # No NVML in a simulated host: the GPUs it states (APPLIANCE_GPU_COUNT).
            expect(row.locator(".gpus")).to_contain_text("4 GPUs (a stated count, no NVML)")
            expect(row.locator(".docker")).to_contain_text("Docker 20.10")
        # Heartbeats go on: the last one moves.
        first = page.locator("#fleet-host-sim-a .heartbeat time").get_attribute("datetime")
        time.sleep(HEARTBEAT_S + 1)
        page.reload()
        assert page.locator("#fleet-host-sim-a .heartbeat time").get_attribute(
            "datetime") != first
        page.screenshot(path=screenshot_path("fleet-sim-hosts.png"), full_page=True)

        # A partition: sim-a stops answering; lost once its last heartbeat is older than
        # the stated time (it was at most one interval old when the pause began).
        hosts["sim-a"].pause()
        lost_after = _wait_state(page, "sim-a", "lost", SILENT_S + HEARTBEAT_S + 10)
        assert lost_after >= SILENT_S - HEARTBEAT_S - 1, lost_after
        age = page.locator("#fleet-host-sim-a .heartbeat").inner_text()
        assert int(re.search(r"\((\d+) s ago\)", age).group(1)) >= SILENT_S, age  # type: ignore[union-attr]
        assert _state(page, "sim-b") == "ready", "the other host is untouched"
        page.screenshot(path=screenshot_path("fleet-sim-host-lost.png"), full_page=True)
        hosts["sim-a"].unpause()
        back_after = _wait_state(page, "sim-a", "ready", HEARTBEAT_S + 10)

        # sim-b's agent killed: started again, on the credential it kept (no second join).
        killed = hosts["sim-b"].kill_agent()
        deadline = time.monotonic() + 30
        while hosts["sim-b"].agent_pid() == killed:
            assert time.monotonic() < deadline, "the agent was not started again"
            time.sleep(0.5)
        first = page.locator("#fleet-host-sim-b .heartbeat time").get_attribute("datetime")
        deadline = time.monotonic() + HEARTBEAT_S + 15
        while page.locator("#fleet-host-sim-b .heartbeat time").get_attribute(
                "datetime") == first:
            assert time.monotonic() < deadline, "the restarted agent never reported"
            time.sleep(1)
            page.reload()
        assert _state(page, "sim-b") == "ready"
        assert _uses("sim-a") == 1 and _uses("sim-b") == 1, "each token joined once"
        print(f"sim hosts: lost {lost_after:.1f}s after the pause (silent {SILENT_S}s, "
              f"heartbeat {HEARTBEAT_S}s), ready {back_after:.1f}s after it returned")
