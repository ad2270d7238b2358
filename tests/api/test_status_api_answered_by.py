"""Which path answers the status reads (the /metrics counter appliance_status_reads_total),
for token reads shaped as API clients and load tools send them, and a host's agent's
liveness, which must not make the reads' stored answers stale (a row lease renewed every
tick once did, every second)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from tests.servers import panel_server
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment, StatusBody
from web.deployments.selectors import deployment_list
from web.fleet.models import FleetHost

pytestmark = pytest.mark.django_db(transaction=True)
METRICS_TOKEN = "metrics-token-for-the-answered-by-test"


@pytest.fixture(scope="module")
def panel(django_db_setup: Any, django_db_blocker: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("answered-by")
    with django_db_blocker.unblock(), panel_server(
            Path(logs / "panel.log"), APPLIANCE_METRICS_TOKEN=METRICS_TOKEN) as url:
        yield url


def _answered_by(base: str) -> dict[str, float]:
    """The panel's counter by path, from its /metrics."""
    text = _keep_alive_gets(base, ["/metrics"], {"Authorization": f"Bearer {METRICS_TOKEN}"})[0]
    found = re.findall(r'appliance_status_reads_total\{answered_by="(\w+)"\} ([0-9.e+]+)',
                       text.decode())
    return {name: float(value) for name, value in found}


def _keep_alive_gets(base: str, paths: list[str], headers: dict[str, str]) -> list[bytes]:
    """GETs one after another on one HTTP/1.1 connection (as a load tool's client keeps
    it); each answer's status line and body, which must be 200s."""
    where = urlsplit(base)
    bodies = []
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for path in paths:
            lines = [f"GET {path} HTTP/1.1", f"Host: {where.netloc}",
                     *(f"{k}: {v}" for k, v in headers.items()), "", ""]
            sock.sendall("\r\n".join(lines).encode())
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            bodies.append(reader.read(length))
    return bodies


def test_token_reads_as_load_tools_send_them_are_answered_before_django(
        panel: str, viewer: Any, token_for: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    # What aiohttp, httpx, wrk and ab send besides the token and the Accept.
    headers = {"Authorization": f"Token {token_for(viewer)}", "Accept": "application/json",
               "User-Agent": "load-tool/1.0", "Accept-Encoding": "gzip, deflate",
               "Connection": "keep-alive"}
    paths = [f"/api/deployments/{deployment.pk}/", f"/api/deployments/{deployment.pk}/summary/"]
    _keep_alive_gets(panel, paths, headers)  # Django's first answers: their headers learnt
    before = _answered_by(panel)
    bodies = _keep_alive_gets(panel, paths * 10, headers)
    after = _answered_by(panel)
    assert all(b'"id":%d' % deployment.pk in body for body in bodies)
    early = sum(after.get(k, 0) - before.get(k, 0) for k in ("asgi_stored", "asgi_rendered"))
    assert early == 20
    assert after.get("django", 0) == before.get("django", 0)
    # A session's read (a cookie) is Django's, and counted so.
    _keep_alive_gets(panel, paths[:1], {**headers, "Cookie": "x=1"})
    assert _answered_by(panel).get("django", 0) == after.get("django", 0) + 1


def _version(pk: int) -> Any:
    return deployment_list(versioned=True).get(pk=pk).row_version


def test_a_hosts_agent_alive_and_renewing_its_lease_leaves_the_reads_version_as_it_is(
        settings: Any) -> None:
    """The reads' ETag and stored answers change with the row's version; the agent's liveness
    (heartbeats, its host lease renewed once a third is spent) is kept on the host's row,
    so a ready engine's reads stay current while its agent ticks."""
    from tests.fleet.hosts import joined, report
    from web.deployments.services.reads import deployment_status_bodies_store
    from web.fleet import agentlease
    from web.fleet import services as fleet
    gpu_2 = joined("gpu-2").host
    deployment = deploying.deployment_create(data=spec(host="gpu-2"), confirm_warnings=True)
    Deployment.objects.filter(pk=deployment.pk).update(status="ready")
    assert deployment_status_bodies_store(deployment_id=deployment.pk)
    version = _version(deployment.pk)
    assert StatusBody.objects.filter(pk=deployment.pk, version=version).exists()
    agentlease.host_agent_claim(host=gpu_2, session="s1")
    for _ in range(3):
        fleet.host_heartbeat(host=gpu_2, facts=fleet.host_facts_from(report()))
        agentlease.host_agent_claim(host=gpu_2, session="s1")
    # Past a third of the lease: renewed, on the host's row only.
    FleetHost.objects.filter(pk=gpu_2.pk).update(
        agent_lease_until=timezone.now() + timedelta(seconds=5))
    gpu_2.refresh_from_db()
    agentlease.host_agent_claim(host=gpu_2, session="s1")
    renewed = FleetHost.objects.get(pk=gpu_2.pk).agent_lease_until
    assert renewed is not None and renewed > timezone.now() + timedelta(seconds=10)
    assert _version(deployment.pk) == version
    assert StatusBody.objects.filter(pk=deployment.pk, version=version).exists()


@pytest.mark.parametrize("if_none_match", [None, "", '"v1"', 'W/"v1"', '"v0", "v1"', "*",
                                           '"v2"', "garbage", ' "v1" ', '"v1",', 'W/"v0"'])
def test_the_fast_paths_if_none_match_decides_as_djangos_own(if_none_match: str | None) -> None:
    from django.http import HttpRequest
    from django.utils.cache import get_conditional_response

    from web.api.asgi import _not_modified

    request = HttpRequest()
    request.method = "GET"
    if if_none_match is not None:
        request.META["HTTP_IF_NONE_MATCH"] = if_none_match
    djangos = get_conditional_response(request, etag='"v1"')
    assert djangos is None or djangos.status_code == 304
    assert _not_modified(if_none_match, '"v1"') == (djangos is not None)
