"""A host lost, then restarted, under a replicated deployment and its companion, with real
parts: two simulated hosts (docker/sim-host: each a container with its own Docker engine
and the host's agent), the panel's server process (uvicorn: the API's ASGI fast path
included), PostgreSQL, Redis; the engines are the simulator.

- A paused host (a partition): once it is silent for APPLIANCE_AGENT_SILENT_S, its rows read
  `unknown` in every API answer (detail, summary, list, replicas) and the list's count says
  so, never `ready`; `ready` again once it returns.
- A host stopped and started (`docker stop`/`docker start`: its own Docker restarts, its
  engines exit with Docker's code 255): its replica and the companion come back `ready` by
  themselves (no Restart), a new run each, within a bound; the death is diagnosed as the
  host's restart, not a signal.

One test, both faults, on one pair of hosts (each start of the hosts costs about a minute on
a loaded machine). Run under the Docker lock (`flock /tmp/e2e.lock`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.test import Client, override_settings

from tests.conftest_docker import docker_client  # noqa: F401
from tests.fleet.simhosts import gateway, host_networks, sim_host_image, sim_hosts
from tests.servers import panel_server
from tests.waiting import wait_for_status
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus, Run
from web.fleet import services
from web.fleet.models import FleetHost
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker,
              pytest.mark.xdist_group("simhosts")]
S = DeploymentStatus
NAMES = ["sim-a", "sim-b"]
SILENT_S = 15  # APPLIANCE_AGENT_SILENT_S: a host's rows read unknown after this
HEARTBEAT_S = 10  # a host's report interval (APPLIANCE_FLEET_HEARTBEAT_S, web/settings.py)
BACKOFF_S = 2  # APPLIANCE_RESTART_BACKOFF_S: the first wait before a replica starts again
ENGINE_IMAGE = "appliance-test-engine:latest"  # as each sim host imports it
HEAL_BOUND_S = 150  # a restarted host's dockerd, its agent, a new engine start, ready


@pytest.fixture
def panel(docker_client: Any, tmp_path: Path) -> Iterator[tuple[str, int, dict[str, Any]]]:  # noqa: F811
    networks = host_networks(docker_client, NAMES)
    allowed = ",".join(["localhost", "127.0.0.1", *(gateway(n) for n in networks.values())])
    with panel_server(tmp_path / "web.log", bind="0.0.0.0", APPLIANCE_ALLOWED_HOSTS=allowed,
                      APPLIANCE_AGENT_SILENT_S=str(SILENT_S),
                      APPLIANCE_RESTART_BACKOFF_S=str(BACKOFF_S),
                      APPLIANCE_ENGINE_IMAGE=ENGINE_IMAGE, APPLIANCE_ENGINE_GPU_REQUESTS="0",
                      APPLIANCE_GPU_COUNT="0") as url:
        yield url, int(url.rsplit(":", 1)[1]), networks


def _spec(name: str, *, gpus: list[int], **more: Any) -> dict[str, Any]:
    """A spec as the trial deploys on its simulated hosts: the simulator's model folder
    (each sim host makes /models/test), no speculation, no self-check."""
    return {"name": name, "recipe": "kimi-k2.6-ddtree", "gpus": gpus, "self_check": False,
            "engine": {"model_path": "/models/test", "tp_size": 1,
                       "speculative_algorithm": "NONE"}, **more}


def _api(url: str, token: str, path: str) -> Any:
    answer = requests.get(f"{url}/api{path}", headers={"Authorization": f"Token {token}"},
                          timeout=10)
    assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
    return answer.json()


def _shown(url: str, token: str, rows: dict[str, int]) -> dict[str, Any]:
    """Every API read of each row's status, as a client polling the panel sees it."""
    listed = {d["id"]: d["status"] for d in _api(url, token, "/deployments/")["results"]}
    seen: dict[str, Any] = {"list": {name: listed.get(pk) for name, pk in rows.items()}}
    for name, pk in rows.items():
        for _ in range(2):  # the first token read of a kind is Django's, the next early
            seen[name] = _api(url, token, f"/deployments/{pk}/")["status"]
            seen[f"{name} summary"] = _api(url, token, f"/deployments/{pk}/summary/")["status"]
    seen["replicas"] = [r["status"] for r in
                        _api(url, token, f"/deployments/{rows['replica 0']}/replicas/")
                        ["results"]]
    return seen


def _until(what: str, check: Any, timeout_s: float) -> float:
    started = time.monotonic()
    while True:
        found = check()
        if found is True:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"{what}: {found}"
        time.sleep(1)


def _list_count(viewer: Any) -> str:
    page = Client()
    page.force_login(viewer)
    html = page.get("/").content.decode()
    start = html.index('class="replicas">') + len('class="replicas">')
    return html[start:html.index("<", start)]


def test_a_lost_hosts_rows_read_unknown_and_a_restarted_hosts_replica_and_companion_heal(
        docker_client: Any, panel: tuple[str, int, dict[str, Any]], viewer: Any,  # noqa: F811
        token_for: Any, settings: Any) -> None:
    url, port, networks = panel
    settings.GPU_COUNT, settings.AGENT_SILENT_S = 0, SILENT_S  # every engine on the hosts
    token = token_for(viewer)
    tokens = {name: services.jointoken_create(host_name=name).secret for name in NAMES}
    image = sim_host_image(docker_client)
    with sim_hosts(docker_client, image, tokens, networks=networks, panel_port=port) as hosts, \
            override_settings(ENGINE_IMAGE=ENGINE_IMAGE, ENGINE_GPU_REQUESTS=False):
        _until("hosts joined", lambda: FleetHost.objects.count() == 2 or
               list(FleetHost.objects.values_list("name", flat=True)), 120)
        base = deploying.deployment_create(
            data=_spec("base", gpus=[1], host="sim-b"), confirm_warnings=True)
        first = deploying.deployment_create(
            data=_spec("ddt", gpus=[0], replicas=2, companion="base"),
            confirm_warnings=True)
        replica = Deployment.objects.get(replica_of=first)
        for pk in (base.pk, first.pk, replica.pk):
            tasks.deploy.apply(args=[pk]).get()
        for pk in (base.pk, first.pk, replica.pk):
            assert wait_for_status(pk, {S.READY, S.FAILED}, 240) == S.READY, \
                Deployment.objects.values("diagnosis", "last_lines").get(pk=pk)
        placed = {pk: host for pk, host in Deployment.objects.filter(
            pk__in=[first.pk, replica.pk]).values_list("pk", "host")}
        assert sorted(placed.values()) == NAMES, placed  # one replica a host
        on_b = next(pk for pk, host in placed.items() if host == "sim-b")
        rows = {"replica 0": first.pk, "replica 1": replica.pk, "base": base.pk}
        lost_rows = {name for name, pk in rows.items() if pk in (on_b, base.pk)}
        assert _list_count(viewer) == "2 replicas (2 ready)"
        assert set(_shown(url, token, rows)["replicas"]) == {"ready"}

        # 1. sim-b paused: its rows read unknown everywhere once it is silent, never ready.
        hosts["sim-b"].pause()
        try:
            def unknown() -> Any:
                seen = _shown(url, token, rows)
                wanted = all(seen[n] == seen[f"{n} summary"] == seen["list"][n] == "unknown"
                             for n in lost_rows)
                others = all(seen[n] == "ready" for n in rows if n not in lost_rows)
                return (wanted and others and sorted(seen["replicas"]) == ["ready", "unknown"]
                        or seen)
            took = _until("sim-b's rows unknown", unknown, SILENT_S + HEARTBEAT_S + 20)
            assert _list_count(viewer) == "2 replicas (1 ready, 1 unknown)"
        finally:
            hosts["sim-b"].unpause()
        _until("sim-b's rows ready again",
               lambda: set(_shown(url, token, rows)["replicas"]) == {"ready"} or "not yet",
               HEARTBEAT_S + 20)
        assert _list_count(viewer) == "2 replicas (2 ready)"
        print(f"host loss: unknown {took:.1f} s after the pause (silent {SILENT_S} s)")

        # 2. sim-b stopped and started: its Docker restarts, its engines exit (255); the
        #    replica and the companion come back by themselves, a new run each.
        runs = dict(Deployment.objects.filter(pk__in=[on_b, base.pk]).values_list("pk", "run"))
        hosts["sim-b"].container.stop(timeout=10)
        stopped = time.monotonic()
        hosts["sim-b"].container.start()

        def healed() -> Any:
            now = dict(Deployment.objects.filter(pk__in=[on_b, base.pk]).values_list(
                "pk", "status"))
            moved = dict(Deployment.objects.filter(pk__in=[on_b, base.pk]).values_list(
                "pk", "run"))
            done = all(now[pk] == S.READY and moved[pk] > runs[pk] for pk in now)
            return done or {"status": now, "runs": moved}
        _until("sim-b's replica and the companion back ready", healed, HEAL_BOUND_S)
        took = time.monotonic() - stopped
        for pk in (on_b, base.pk):
            died = Run.objects.get(deployment_id=pk, number=runs[pk])
            assert died.outcome == "died", (pk, died.outcome, died.diagnosis)
            summary = str((died.diagnosis or {}).get("summary", ""))
            assert "signal 127" not in summary, summary
            print(f"healed #{pk}: {summary}")
        assert _list_count(viewer) == "2 replicas (2 ready)"
        assert {r["status"] for r in _api(url, token, f"/deployments/{first.pk}/replicas/")
                ["results"]} == {"ready"}
        print(f"host restart: replica and companion ready {took:.1f} s after `docker stop`")
