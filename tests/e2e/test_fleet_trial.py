"""The fleet as shipped, on the one-command GPU-less trial (compose.yaml +
docker/compose.trial.yaml, docker-compose v1.29 here; v2 reads the same files), driven from
Chromium and the APIs as a user would:

- two simulated hosts (docker/sim-host: their own Docker engines) join by themselves, and
  every page says the engines are the simulator;
- a deployment with 3 replicas is placed across them and called through the gateway with
  a key made in the panel;
- a rolling redeploy goes one replica at a time while clients call it: 0 failed;
- a log-probs request to a DDTREE deployment with a companion gets the companion's answer,
  with the header that says so;
- one host killed: the Fleet page says it is lost, its replica leaves ready, and the
  clients' requests keep succeeding.

Local base images stand in for the registry's (docker/base/make-base-image.sh).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Page, expect

import docker
from tests.conftest_docker import TEST_SESSION
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
PROJECT = f"appliance-trial-{TEST_SESSION[:6]}"
COMPOSE = shutil.which("docker-compose")
FILES = ["-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / "docker" / "compose.trial.yaml")]
LOCAL_IMAGES = {
    "APPLIANCE_PYTHON_IMAGE": "appliance-python:bookworm",
    "APPLIANCE_REDIS_IMAGE": "appliance-redis:bookworm",
    "APPLIANCE_POSTGRES_IMAGE": "appliance-postgres:bookworm",
}
ADMIN_PASSWORD = r"Admin account 'admin' password: '([^']+)'"
SILENT_S = 10  # APPLIANCE_AGENT_SILENT_S: a killed host is lost after this
SERVED_BY = "x-appliance-served-by"
RECIPE = "kimi-k2.6-ddtree"  # any shipped recipe: the trial runs a fixed image, builds none


class Trial:
    """docker-compose for one project with the trial's override and a user's .env."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env_file = tmp / ".env"
        values = {
            **LOCAL_IMAGES,
            "APPLIANCE_PANEL_IMAGE": f"sd-appliance:{PROJECT}",
            "APPLIANCE_SIM_HOST_IMAGE": f"sd-appliance-sim-host:{PROJECT}",
            "APPLIANCE_PANEL_PORT": str(self.port),
            "APPLIANCE_CSRF_TRUSTED_ORIGINS": self.url,
            "APPLIANCE_ENGINE_NETWORK": f"{PROJECT}-engines",
            "APPLIANCE_HOST_NAME": "trial-panel",
            "APPLIANCE_AGENT_SILENT_S": str(SILENT_S),
            "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
            "APPLIANCE_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
        }
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        self.images = [values["APPLIANCE_PANEL_IMAGE"], values["APPLIANCE_SIM_HOST_IMAGE"]]

    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        done = subprocess.run([str(COMPOSE), "-p", PROJECT, *FILES, "--env-file",
                               str(self.env_file), *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: rc {done.returncode}\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout + done.stderr

    def wait_healthy(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(1)
        raise AssertionError("the panel never became healthy:\n" + self.compose(
            "logs", "--tail", "60"))

    def container(self, service: str) -> Any:
        return docker.from_env().containers.list(ignore_removed=True, all=True, filters={"label": [
            f"com.docker.compose.project={PROJECT}", f"com.docker.compose.service={service}"]})[0]

    def manage(self, *argv: str) -> str:
        return self.compose("exec", "-T", "web", "python3", "manage.py", *argv)


@pytest.fixture
def trial(tmp_path: Path, trial_images: set[str]) -> Iterator[Trial]:
    if COMPOSE is None:
        pytest.skip("docker-compose not installed")
    client = docker.from_env()
    missing = [t for t in [*LOCAL_IMAGES.values(), "appliance-base:bookworm"]
               if not client.images.list(name=t)]
    if missing:
        pytest.skip(f"local base images missing ({', '.join(missing)}): run "
                    "bash docker/base/make-base-image.sh")
    made = Trial(tmp_path)
    trial_images.update(made.images)
    try:
        yield made
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "trial-logs.txt").write_text(made.compose("logs", check=False))
        # The hosts' engines live in the hosts' own Docker: down -v ends them with the hosts.
        made.compose("down", "-v", check=False)
        for network in client.networks.list(names=[f"{PROJECT}-engines"]):
            network.remove()


def _spec(name: str, *, gpus: list[int], replicas: int = 1, algorithm: str = "NONE",
          companion: str | None = None) -> dict[str, Any]:
    engine: dict[str, Any] = {"model_path": "/models/test", "tp_size": 1,
                              "speculative_algorithm": algorithm}
    if algorithm == "DDTREE":
        engine.update(speculative_draft_model_path="/models/test-dflash",
                      speculative_num_draft_tokens=8, speculative_ddtree_budget=7,
                      attention_backend="fa3")
    spec: dict[str, Any] = {"name": name, "recipe": RECIPE, "gpus": gpus, "engine": engine,
                            "replicas": replicas, "self_check": False}
    if companion:
        spec["companion"] = companion
    return spec


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.headers = f"{url}/api", {"Authorization": f"Token {token}"}

    def get(self, path: str) -> Any:
        response = requests.get(self.url + path, headers=self.headers, timeout=10)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = requests.post(self.url + path, json=body, headers=self.headers, timeout=30)
        assert response.status_code in (200, 201, 202), (path, response.text[:2000])
        return response.json()


def _replicas(api: Api, pk: int) -> list[dict[str, Any]]:
    return list(api.get(f"/deployments/{pk}/replicas/")["results"])


def _wait_replicas_ready(api: Api, pk: int, count: int, timeout: float = 240) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = _replicas(api, pk)
        if len(rows) == count and all(r["status"] == "ready" for r in rows):
            return rows
        assert time.monotonic() < deadline, f"replicas of #{pk} not ready: {rows}"
        time.sleep(1)


class Clients:
    """Clients calling a served name through the gateway with a key until stopped: what a
    benchmark through the gateway does, counting every answer that is not a whole 200."""

    def __init__(self, url: str, key: str, model: str, concurrency: int = 4) -> None:
        self.url, self.model = f"{url}/v1/chat/completions", model
        self.headers = {"Authorization": f"Bearer {key}"}
        self.ok = 0
        self.failed: list[str] = []
        self.replicas: set[str] = set()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(concurrency)]

    def _run(self) -> None:
        body = {"model": self.model, "max_tokens": 16,
                "messages": [{"role": "user", "content": "hello"}]}
        while not self._stop.is_set():
            try:
                answer = requests.post(self.url, json=body, headers=self.headers, timeout=60)
                if answer.status_code == 200 and answer.json()["choices"][0]["message"]:
                    self.ok += 1
                    self.replicas.add(answer.headers.get("x-appliance-replica", "?"))
                else:
                    self.failed.append(f"{answer.status_code} {answer.text[:300]}")
            except (requests.RequestException, ValueError, KeyError) as exc:
                self.failed.append(repr(exc))

    def __enter__(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)


def _login(page: Page, url: str, password: str) -> None:
    page.goto(f"{url}/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", password)
    page.click("#login")
    expect(page.locator("h1")).to_have_text("Deployments")


def _fleet_state(page: Page, url: str, host: str) -> str:
    page.goto(f"{url}/fleet/")
    state = page.locator(f"#fleet-host-{host} .state .status")
    return state.inner_text() if state.count() else "not joined"


def test_the_trial_places_replicas_across_two_hosts_and_keeps_serving_through_changes(
        trial: Trial, page: Page) -> None:
    trial.compose("up", "-d", "--build", timeout=1500)
    trial.wait_healthy()
    setup = trial.compose("logs", "trial-setup")
    assert "sdj-" not in setup and "a join token for sim-a" in setup, "tokens never printed"
    password = re.findall(ADMIN_PASSWORD, trial.compose("logs", "web"))[0]
    page.set_default_navigation_timeout(90_000)  # a loaded 2-core machine, compose and hosts
    _login(page, trial.url, password)

    # 1. Both hosts joined by themselves; every page says the engines are the simulator.
    deadline = time.monotonic() + 180
    while any(_fleet_state(page, trial.url, h) != "ready" for h in ("sim-a", "sim-b")):
        assert time.monotonic() < deadline, trial.compose("logs", "--tail", "40", "sim-a",
                                                          "sim-b")
        time.sleep(2)
    for path in ("/", "/fleet/", "/benchmarks/"):
        page.goto(f"{trial.url}{path}")
        expect(page.locator("#simulator-banner")).to_contain_text("Simulator")

    token = re.findall(r"(sda_[0-9a-f]{64})", trial.manage("apitoken", "create", "admin"))[0]
    key = trial.compose("exec", "-T", "web", "python3", "manage.py", "apikey", "create",
                        "admin", "trial").split("\n")[0].strip()
    assert key.startswith("sk-sd-"), key
    api = Api(trial.url, token)

    # 2. Three replicas, placed across both hosts, called through the gateway with the key.
    fleet = api.post("/deployments/", {"spec": _spec("trial-fleet", gpus=[0], replicas=3),
                                       "confirm_warnings": True})["id"]
    rows = _wait_replicas_ready(api, fleet, 3)
    assert {r["host"] for r in rows} == {"sim-a", "sim-b"}, rows
    page.goto(f"{trial.url}/deployments/{fleet}/")
    expect(page.locator("#replica-rows tbody tr")).to_have_count(3)
    answer = requests.post(f"{trial.url}/v1/chat/completions", timeout=30,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": "trial-fleet", "max_tokens": 8,
                                 "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    # The simulator answers, and the API and /v1 say so as the banner does (the hosts'
    # simulator images are read at most once every 30 s: bounded by that).
    deadline = time.monotonic() + 40
    while (answer.headers.get("x-appliance-simulator") != "true"
           or api.get(f"/deployments/{fleet}/")["simulator"] is not True):
        assert time.monotonic() < deadline, dict(answer.headers)
        time.sleep(1)
        answer = requests.post(f"{trial.url}/v1/chat/completions", timeout=30,
                               headers={"Authorization": f"Bearer {key}"},
                               json={"model": "trial-fleet", "max_tokens": 8,
                                     "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200, answer.text
    # Off the deployment's live page while the roll streams its replicas' logs for minutes:
    # a loaded machine's Chromium then takes over 30 s to leave it (seen here).
    page.goto(f"{trial.url}/fleet/")

    # 3. A rolling redeploy (a new spec) while the product's benchmark runs through the
    #    gateway (the worker, a key of the run's own) and clients call it: one replica at a
    #    time, none of their requests failed.
    bench = api.post("/benchmarks/", {
        "deployments": [fleet], "through_gateway": True, "levels": [4],
        "num_prompts": 1200, "request_rate": 10, "input_len": 16, "output_len": 16})["id"]
    deadline = time.monotonic() + 120
    while api.get(f"/benchmarks/{bench}/")["status"] != "running":
        assert time.monotonic() < deadline, api.get(f"/benchmarks/{bench}/")
        time.sleep(1)
    with Clients(trial.url, key, "trial-fleet") as clients:
        new = _spec("trial-fleet", gpus=[0], replicas=3)
        new["engine"]["decode_log_interval"] = 8
        api.post(f"/deployments/{fleet}/redeploy/", {"spec": new, "confirm_warnings": True})
        deadline = time.monotonic() + 300
        while (rolling := api.get(f"/deployments/{fleet}/")["rolling"]).get("state") != "done":
            assert rolling.get("state") in ("rolling", None), rolling
            assert time.monotonic() < deadline, rolling
            time.sleep(1)
    assert clients.failed == [] and clients.ok > 0, (clients.ok, clients.failed[:5])
    assert all(r["run"] == 2 for r in _wait_replicas_ready(api, fleet, 3))
    assert api.get(f"/benchmarks/{bench}/")["status"] == "running", "it spans the whole roll"
    deadline = time.monotonic() + 240
    while (run := api.get(f"/benchmarks/{bench}/"))["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, run["progress"]
        time.sleep(2)
    assert run["status"] == "done" and run["failed_requests"] == 0, (run["error"],
                                                                     run["results"])
    assert [m["completed"] for m in run["results"]["levels"]] == [1200]

    # 4. Log-probs to a DDTREE deployment: its engine refuses them, its companion (the same
    #    target without speculation) answers, and the answer says so.
    base = api.post("/deployments/", {"spec": _spec("trial-base", gpus=[2]),
                                      "confirm_warnings": True})["id"]
    ddt = api.post("/deployments/", {"spec": _spec("trial-ddt", gpus=[3], algorithm="DDTREE",
                                                   companion="trial-base"),
                                     "confirm_warnings": True})["id"]
    _wait_replicas_ready(api, base, 1)
    _wait_replicas_ready(api, ddt, 1)
    answer = requests.post(f"{trial.url}/v1/chat/completions", timeout=30,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": "trial-ddt", "max_tokens": 4, "logprobs": True,
                                 "top_logprobs": 2,
                                 "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    assert answer.headers.get(SERVED_BY) == "trial-base", dict(answer.headers)
    assert answer.json()["choices"][0]["logprobs"]["content"], answer.json()

    # 5. A host killed while clients call the deployment: the Fleet page says it is lost,
    #    its replica is no longer ready, and the requests keep succeeding.
    victim = next(r for r in _wait_replicas_ready(api, fleet, 3) if r["index"] == 1)
    with Clients(trial.url, key, "trial-fleet") as clients:
        time.sleep(2)
        trial.container(victim["host"]).kill()
        deadline = time.monotonic() + SILENT_S + 30
        while api.get(f"/fleet/hosts/{victim['host']}/")["state"] != "lost":
            assert time.monotonic() < deadline, "the killed host was never lost"
            time.sleep(1)
        assert _fleet_state(page, trial.url, victim["host"]) == "lost"
        page.goto(f"{trial.url}/deployments/{fleet}/")
        expect(page.locator('#replica-rows tr[data-replica="1"] .status')).not_to_have_text(
            "ready", timeout=30_000)
        time.sleep(5)  # requests go on with the survivors
    assert clients.failed == [] and clients.ok > 0, (clients.ok, clients.failed[:5])
