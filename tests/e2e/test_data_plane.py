"""The data plane outlives the control plane, on the one-command trial (compose.yaml +
docker/compose.trial.yaml, docker-compose v1.29 here): /v1 is served by the gateway
instances behind the proxy, so a client calling every 0.2 s through `docker-compose restart
web worker agent` and through a rolling restart of gateway-a then gateway-b sees no failed
request; the deployment's metric series has no gap across the panel's restart (the hosts'
monitors keep what the panel did not take); an idle trial leaves the cores mostly idle and
its access log without the hosts' own calls; `down -v` removes everything `up` made.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

import docker
from tests.e2e.test_fleet_trial import (  # noqa: F401 - trial: the fixture
    ARTIFACTS,
    COMPOSE,
    FILES,
    PROJECT,
    ROOT,
    Api,
    Trial,
    _spec,
    _wait_replicas_ready,
    trial,
)

CALL_EVERY_S = 0.2
# The idle trial's CPU (every container of the project, the hosts' Docker engines included)
# over IDLE_S, in cores: mostly idle on the 2-core machine it was found busy on (a load of
# 3.7), with no deployment and with two replicas serving the simulator's own clients.
IDLE_S = 30
IDLE_CORES_MAX = 0.5
SERVING_CORES_MAX = 1.0  # two simulated engines decoding for their synthetic clients
METRICS_INTERVAL_S = 2  # APPLIANCE_METRICS_INTERVAL_S, compose's default


class Caller:
    """One request every CALL_EVERY_S through the proxy (a stream every other one), each
    waited for up to 60 s; every answer that is not a whole 200 is a failure, with its time."""

    def __init__(self, url: str, key: str, model: str) -> None:
        self.url, self.model, self.key = f"{url}/v1/chat/completions", model, key
        self.ok = 0
        self.failed: list[str] = []
        self.gateways: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, stream: bool) -> None:
        body = {"model": self.model, "max_tokens": 8, "stream": stream,
                "messages": [{"role": "user", "content": "every 0.2 s"}]}
        answer = requests.post(self.url, json=body, timeout=60, stream=stream,
                               headers={"Authorization": f"Bearer {self.key}"})
        text = answer.content.decode(errors="replace")
        whole = ("data: [DONE]" in text) if stream else bool(
            answer.status_code == 200 and answer.json()["choices"][0]["message"])
        if answer.status_code == 200 and whole:
            self.ok += 1
        else:
            self.failed.append(f"{time.strftime('%X')} {answer.status_code} {text[:300]}")

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._one(stream=n % 2 == 1)
            except (requests.RequestException, ValueError, KeyError) as exc:
                self.failed.append(f"{time.strftime('%X')} {exc!r}")
            n += 1
            self._stop.wait(max(0.0, CALL_EVERY_S - (time.monotonic() - started)))

    def __enter__(self) -> Caller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(90)


def _containers(client: Any) -> list[Any]:
    return client.containers.list(ignore_removed=True, filters={"label": f"com.docker.compose.project={PROJECT}"})


CPUACCT = Path("/sys/fs/cgroup/cpuacct/docker")  # cgroup v1, Docker's cgroupfs driver


def _cpu_s(client: Any) -> dict[str, float]:
    """CPU time so far, in seconds, of each running container of the project and of each
    engine inside a simulated host (the host's own dockerd puts them beside it, not in its
    cgroup): Docker's account of the first, the kernel's of the second."""
    used = {}
    for container in _containers(client):
        stats = client.api.stats(container.id, stream=False, one_shot=True)
        used[container.name] = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        if container.name.endswith(("sim-a-1", "sim-b-1", "sim-a_1", "sim-b_1")):
            inner = container.exec_run(["docker", "ps", "-q", "--no-trunc"]).output.split()
            for cid in inner:
                usage = CPUACCT / cid.decode() / "cpuacct.usage"
                if usage.exists():
                    used[f"{container.name}/{cid.decode()[:12]}"] = int(
                        usage.read_text()) / 1e9
    return used


def _cores(client: Any, what: str) -> tuple[float, dict[str, float]]:
    """The project's CPU over IDLE_S, in cores, in all and per container; noted in
    artifacts/trial-idle-cpu.txt."""
    before, started = _cpu_s(client), time.monotonic()
    time.sleep(IDLE_S)
    after, took = _cpu_s(client), time.monotonic() - started
    per = {name: round((after[name] - before.get(name, 0.0)) / took, 3) for name in after}
    total = round(sum(per.values()), 3)
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / "trial-idle-cpu.txt").open("a") as out:
        out.write(f"{what}: {total} cores over {took:.0f} s: {per}\n")
    print(f"idle trial, {what}: {total} cores over {took:.0f} s: {per}")
    return total, per


def _healthy(stack: Trial, service: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (state := stack.container(service).attrs["State"].get("Health", {}).get(
            "Status")) != "healthy":
        assert time.monotonic() < deadline, f"{service} is {state}"
        time.sleep(0.5)


def _gaps(points: list[dict[str, Any]], start: float, end: float) -> list[tuple[float, float]]:
    times = sorted(p["t"] for p in points if start <= p["t"] <= end)
    return [(a, b) for a, b in zip(times, times[1:], strict=False)
            if b - a > 2 * METRICS_INTERVAL_S + 1]


def test_the_trials_files_put_the_gateways_on_the_hosts_networks_and_make_the_engine_network(
        ) -> None:
    """What the run below relies on, read by docker-compose itself (seconds, no stack): the
    gateways reach the hosts' engines over the hosts' networks, the engine network is
    compose's in the trial (so `down -v` removes it), closed as the agent makes its own, and
    the simulator decodes at a pace that leaves an idle trial idle."""
    if COMPOSE is None:
        pytest.skip("docker-compose not installed")
    done = subprocess.run([COMPOSE, *FILES, "config"], cwd=ROOT, capture_output=True,
                          text=True, check=False, env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    services, networks = config["services"], config["networks"]
    for name in ("gateway-a", "gateway-b"):
        assert set(services[name]["networks"]) == {"internal", "engines", "sim-a", "sim-b"}
    assert set(services["agent"]["networks"]) == {"internal", "engines"}
    # The panel loop steps the hosts' rolls from the panel's database and Redis alone.
    assert set(services["loop"]["networks"]) == {"internal"}
    assert "engines" not in services["proxy"]["networks"]
    engines = networks["engines"]
    assert engines["name"] == "appliance-engines" and engines["internal"] is True
    assert engines["driver_opts"] == {"com.docker.network.bridge.inhibit_ipv4": "true"}
    extra = services["sim-a"]["environment"]["APPLIANCE_ENGINE_EXTRA_ENV"]
    assert "TEST_ENGINE_TOKEN_S=0.01" in extra.split(","), extra


@pytest.fixture
def quiet_trial(trial: Trial) -> Iterator[Trial]:  # noqa: F811
    """The trial as a user starts it: the default agent silence (30 s), not the fleet
    test's 10 s, so a panel away for a restart is not taken for lost hosts."""
    text = trial.env_file.read_text()
    trial.env_file.write_text(re.sub(r"APPLIANCE_AGENT_SILENT_S=\d+\n", "", text))
    yield trial


def test_a_restart_of_the_panel_or_of_one_gateway_loses_no_request(
        quiet_trial: Trial) -> None:
    stack = quiet_trial
    client = docker.from_env()
    stack.compose("up", "-d", "--build", timeout=1500)
    stack.wait_healthy()
    token = re.findall(r"(sda_[0-9a-f]{64})", stack.manage("apitoken", "create", "admin"))[0]
    key = stack.manage("apikey", "create", "admin", "data-plane").split("\n")[0].strip()
    api = Api(stack.url, token)
    deadline = time.monotonic() + 180
    for host in ("sim-a", "sim-b"):
        while (requests.get(f"{api.url}/fleet/hosts/{host}/", headers=api.headers,
                            timeout=10).json().get("state")) != "ready":
            assert time.monotonic() < deadline, stack.compose("logs", "--tail", "40", host)
            time.sleep(2)

    # 1. Idle: no deployment, both hosts joined; what every container of it uses.
    time.sleep(10)  # past the first starts' work
    idle, per = _cores(client, "no deployment")
    assert idle < IDLE_CORES_MAX, per
    # The hosts' own successful calls stay out of web's access log; others are in it.
    logged = stack.compose("logs", "--no-color", "web")
    assert re.search(r'"GET /api/fleet/hosts/[^"]*" 200', logged) is not None, logged[-2000:]
    host_lines = re.findall(r'"\w+ /api/fleet/host/[^"]*" [23]\d\d', logged)
    assert host_lines == [], host_lines[:5]

    # 2. Two replicas, one a host, called every 0.2 s through the panel's restarts and a
    #    rolling restart of the gateway instances.
    fleet = api.post("/deployments/", {"spec": _spec("plane", gpus=[0], replicas=2),
                                       "confirm_warnings": True})["id"]
    assert {r["host"] for r in _wait_replicas_ready(api, fleet, 2)} == {"sim-a", "sim-b"}
    # Idle but serving: the simulator's own synthetic clients keep both engines decoding
    # (docker/compose.trial.yaml), their lines and points shipped to the panel.
    time.sleep(10)
    serving, per = _cores(client, "two replicas, no client")
    assert serving < SERVING_CORES_MAX, per
    with Caller(stack.url, key, "plane") as caller:
        time.sleep(3)
        panel_down = time.time()
        stack.compose("restart", "web", "worker", "agent")
        stack.wait_healthy()
        _healthy(stack, "web")
        panel_up = time.time()
        time.sleep(3)
        calls_before_roll = caller.ok
        for gateway in ("gateway-a", "gateway-b"):
            stack.compose("restart", gateway)
            _healthy(stack, gateway)
            time.sleep(2)  # the proxy's check sees it back (every second)
        time.sleep(2)
    timeline = f"panel down {panel_down:.0f}, up {panel_up:.0f}"
    assert caller.failed == [], (caller.ok, timeline, caller.failed[:5])
    # A request every 0.2 s for the whole of it: the panel away 10 s and more, each gateway
    # restart a few seconds.
    assert caller.ok >= (time.time() - panel_down) / CALL_EVERY_S * 0.5, caller.ok
    assert caller.ok - calls_before_roll >= 20

    # 3. The metric series has no gap across the panel's restart: each host's monitor kept
    #    what the panel did not take and sent it with its next report.
    time.sleep(2 * METRICS_INTERVAL_S + 2)
    window = f"start={panel_down - 20:.0f}&end={panel_up + 20:.0f}"
    points = api.get(f"/deployments/{fleet}/metrics/?{window}")["points"]
    assert len(points) >= (panel_up - panel_down) / METRICS_INTERVAL_S, points[:3]
    gaps = _gaps(points, panel_down - 10, panel_up + 10)
    # Each replica row's own series too, where the API serves it by the row's id.
    for row in api.get(f"/deployments/{fleet}/replicas/")["results"]:
        answer = requests.get(f"{api.url}/deployments/{row['id']}/metrics/?{window}",
                              headers=api.headers, timeout=10)
        if answer.status_code == 200 and row["id"] != fleet:
            gaps += _gaps(answer.json()["points"], panel_down - 10, panel_up + 10)

    # 4. down -v removes what up made: containers, networks (the engine network too) and
    #    volumes of the project.
    stack.compose("down", "-v")
    left = [c.name for c in client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"com.docker.compose.project={PROJECT}"})]
    networks = [n.name for n in client.networks.list(names=[PROJECT, f"{PROJECT}-engines"])
                if n.name.startswith(PROJECT)]
    volumes = [v.name for v in client.volumes.list(
        filters={"label": f"com.docker.compose.project={PROJECT}"})]
    assert (left, networks, volumes) == ([], [], []), (left, networks, volumes)
    # No gap: a host's monitor never waits on the panel past its next scrape, and keeps
    # (and its follower waits for) a panel away for up to 10 minutes (docs/fleet.md).
    assert gaps == [], (timeline, gaps)
