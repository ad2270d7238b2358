"""The product as shipped: compose.yaml, the panel image and production defaults, run with
docker-compose (v1.29 here; v2 reads the same file), driven from Chromium.

Local base images (docker/base/make-base-image.sh) stand in for the registry's; the engine
image is built by the appliance's worker from a site recipe whose SGLang source is the
test engine's package (CI cannot fetch SGLang). Nothing here is tuned for the test beyond
what a user on a machine without GPUs would set in .env.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests
import yaml
from playwright.sync_api import Page, expect

import docker
from appliance.runtime.follower import SCRAPE_ACCESS
from tests.conftest_docker import TEST_SESSION, engines_of
from tests.e2e.gateway_flow import serve_and_verify
from tests.e2e.logpane import SCROLL_TOP as _SCROLL_TOP
from tests.e2e.logpane import TIMED_OLDER as _TIMED_OLDER
from tests.e2e.screenshots import screenshot_path
from tests.eventfill import fill_sql
from tests.models import CONFIGS, write_model
from tests.servers import free_port
from tests.site_recipes import commit_all
from web.deployments.models import Deployment, Installation

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
# Its own project per test session: another session's compose run beside this one (another
# engineer's, a CI job's) has other containers, networks and volumes.
PROJECT = f"appliance-e2e-{TEST_SESSION[:6]}"
LOCAL_IMAGES = {
    "APPLIANCE_PYTHON_IMAGE": "appliance-python:bookworm",
    "APPLIANCE_REDIS_IMAGE": "appliance-redis:bookworm",
    "APPLIANCE_POSTGRES_IMAGE": "appliance-postgres:bookworm",
}
PANEL_IMAGE = "sd-appliance:e2e"
ADMIN_PASSWORD = r"Admin account 'admin' password: '([^']+)'"
COMPOSE = shutil.which("docker-compose")
# A busy deployment's log (about 15 events/s: 1,000,000 is under a day) and the detail page
# on it under compose; the figures are printed, their targets checked by bench/log_history.py.
EVENTS = 1_000_000
PAGES_BACK = 5


def _mount(volume: str | dict[str, Any]) -> dict[str, Any]:
    """A service's volume as `config` prints it (v1.29's short syntax, v2's long) in one
    shape: source, target, read_only."""
    if isinstance(volume, dict):
        return {"source": volume.get("source", ""), "target": volume["target"],
                "read_only": bool(volume.get("read_only", False))}
    source, target, *mode = volume.split(":")
    return {"source": source, "target": target,
            "read_only": bool(mode) and "ro" in mode[0].split(",")}


def test_docker_compose_accepts_the_file_and_keeps_engines_off_the_database_network() -> None:
    if COMPOSE is None:
        pytest.skip("docker-compose not installed")
    result = subprocess.run(
        [COMPOSE, "-f", "compose.yaml", "config"], cwd=ROOT, capture_output=True, text=True,
        check=False, env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                          "APPLIANCE_PYTHON_IMAGE": "local/python:3"},
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
    assert set(services) == {"init", "web", "worker", "agent", "loop", "redis", "postgres",
                             "gateway-a", "gateway-b", "proxy"}
    for name in ("postgres", "redis", "web", "gateway-a", "gateway-b"):
        assert services[name]["healthcheck"]["test"], f"{name} has a health check"
    for name in ("web", "worker", "loop", "gateway-a", "gateway-b"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("web", "worker", "agent", "loop", "gateway-a", "gateway-b"):
        assert services[name]["restart"] == "unless-stopped"
    # This machine's agent is the fleet's agent program: the host API at web's internal
    # address, its own name, and nothing of the database, Redis or the panel's secrets.
    agent = services["agent"]
    assert agent["environment"]["APPLIANCE_PANEL_URL"] == "http://web:8000"
    assert agent["environment"]["APPLIANCE_HOST_NAME"] == "gpu-host"
    assert not [k for k in agent["environment"] if "DATABASE" in k or "REDIS" in k
                or "SECRET_KEY" in k or "ADMIN" in k]
    assert "postgres" not in agent["depends_on"] and "redis" not in agent["depends_on"]
    assert agent["depends_on"]["web"]["condition"] == "service_healthy"
    assert agent["depends_on"]["loop"]["condition"] == "service_started"
    assert not [m for m in map(_mount, agent["volumes"]) if m["source"] == "secrets"], \
        "the panel's secrets volume (secret key, database password) is not the agent's"
    assert "web" in services["web"]["environment"]["APPLIANCE_ALLOWED_HOSTS"].split(",")
    assert services["worker"]["depends_on"]["web"]["condition"] == "service_healthy"
    # The panel loop (web/loop.py): the image's `loop` role, after web's migrations, with the
    # database and Redis (internal) and no Docker socket; a small pool of its own.
    loop = services["loop"]
    assert loop["command"] == ["loop"] and set(loop["networks"]) == {"internal"}
    assert loop["depends_on"]["web"]["condition"] == "service_healthy"
    assert "docker.sock" not in str(loop["volumes"])
    assert {"APPLIANCE_DATABASE_URL", "APPLIANCE_REDIS_URL"} <= set(loop["environment"])
    # The own host's join token (web/loop.py keeps it): a named volume that the loop alone
    # writes and the agent alone reads; each is told the file's path inside it.
    token_mounts = {name: [m for m in map(_mount, service.get("volumes") or [])
                           if m["source"] == "own-host-token"]
                    for name, service in services.items()}
    assert {name: [(m["target"], m["read_only"]) for m in mounts]
            for name, mounts in token_mounts.items() if mounts} == {
        "loop": [("/var/lib/appliance/own-host", False)],
        "agent": [("/var/lib/appliance/own-host", True)]}
    assert "own-host-token" in config["volumes"]
    token_file = "/var/lib/appliance/own-host/token"
    assert loop["environment"]["APPLIANCE_OWN_HOST_TOKEN_FILE"] == token_file
    assert services["agent"]["environment"]["APPLIANCE_JOIN_TOKEN_FILE"] == token_file
    # Engines never join the network that holds Redis and PostgreSQL.
    assert services["agent"]["environment"]["APPLIANCE_ENGINE_NETWORK"] == "appliance-engines"
    assert "internal" in services["postgres"]["networks"]
    assert "appliance-engines" not in config.get("networks", {})
    assert "/var/run/docker.sock:/var/run/docker.sock" in str(services["agent"]["volumes"])
    assert "/var/run/docker.sock" not in str(services["web"].get("volumes"))
    # The models folder is a long-syntax bind (never made by Docker when it is missing).
    # Read-only but in the worker, whose model downloads write into it (web/store).
    for name in ("web", "worker", "agent"):
        models = [v for v in services[name]["volumes"]
                  if isinstance(v, dict) and v.get("target") == "/models"]
        mount = {"type": "bind", "source": "/models", "target": "/models"}
        assert models == [mount if name == "worker" else {**mount, "read_only": True}], \
            services[name]["volumes"]
    assert services["web"]["environment"]["APPLIANCE_ADMIN_PASSWORD_FILE"] == \
        "/var/lib/appliance/secrets/admin_password"
    assert services["web"]["build"]["args"]["PYTHON_IMAGE"] == "local/python:3"
    # The proxy publishes the panel's port (web and the gateways behind it publish none);
    # the gateways are processes of their own, with no Docker socket and no models mount.
    published = services["proxy"]["ports"][0]
    assert "127.0.0.1" in str(published) and "8000" in str(published)
    assert not services["web"].get("ports")
    for name in ("gateway-a", "gateway-b"):
        assert services[name]["command"] == ["gateway"]
        assert not services[name].get("ports")
        assert "docker.sock" not in str(services[name]["volumes"])
        assert services[name]["depends_on"]["web"]["condition"] == "service_healthy"
        assert services["agent"]["depends_on"][name]["condition"] == "service_started"
    assert services["worker"]["environment"]["APPLIANCE_GATEWAY_URL"] == "http://proxy:8000"
    # No built-in secret: generated once into the secrets volume.
    env = services["web"]["environment"]
    assert env["APPLIANCE_SECRET_KEY"] == ""
    assert env["APPLIANCE_SECRET_KEY_FILE"].startswith("/var/lib/appliance/secrets/")
    assert "appliance@postgres" in env["APPLIANCE_DATABASE_URL"]
    assert ":" not in env["APPLIANCE_DATABASE_URL"].split("@")[0].removeprefix("postgres://")
    gpu = subprocess.run(
        [COMPOSE, "-f", "compose.yaml", "-f", "docker/compose.gpu.yaml", "config"], cwd=ROOT,
        capture_output=True, text=True, check=False, env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert gpu.returncode == 0, gpu.stderr
    devices = yaml.safe_load(gpu.stdout)["services"]["agent"]["deploy"]["resources"]
    assert devices["reservations"]["devices"][0]["capabilities"] == ["utility"]
    example = (ROOT / ".env.example").read_text()
    for name in ("APPLIANCE_ENGINE_GPU_REQUESTS", "APPLIANCE_ENGINE_EXTRA_ENV",
                 "APPLIANCE_CA_BUNDLE", "APPLIANCE_MODELS_DIR", "APPLIANCE_PANEL_PORT",
                 "APPLIANCE_POSTGRES_IMAGE", "APPLIANCE_REDIS_IMAGE", "APPLIANCE_PYTHON_IMAGE",
                 "APPLIANCE_POSTGRES_MAX_CONNECTIONS"):
        assert f"#{name}=" in example, f"{name} is documented in .env.example"
    # PostgreSQL has room for every pool: web's processes (at most 4 by the entrypoint) and
    # the worker's, at the shipped pool size, beside a few admin sessions (the agent has none).
    limit = int(services["postgres"]["command"][1].removeprefix("max_connections="))
    pools = 4 + 1  # web processes, worker
    small = sum(int(services[name]["environment"]["APPLIANCE_DB_POOL_MAX_SIZE"])
                for name in ("gateway-a", "gateway-b", "loop"))
    assert limit >= pools * 20 + small + 1 + 10  # 1: the loop's lock connection


def test_compose_refuses_to_start_when_the_models_folder_is_missing(tmp_path: Path) -> None:
    if COMPOSE is None:
        pytest.skip("docker-compose not installed")
    missing = tmp_path / "no-models-here"
    project = f"{PROJECT}-nomodels"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "APPLIANCE_MODELS_DIR": str(missing),
           # Any local image: the container is refused before anything in it runs.
           "APPLIANCE_PANEL_IMAGE": LOCAL_IMAGES["APPLIANCE_PYTHON_IMAGE"]}
    try:
        done = subprocess.run([COMPOSE, "-p", project, "-f", "compose.yaml", "run", "--rm",
                               "--no-deps", "web", "true"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=False, env=env)
    finally:
        subprocess.run([COMPOSE, "-p", project, "-f", "compose.yaml", "down", "-v"], cwd=ROOT,
                       capture_output=True, timeout=120, check=False, env=env)
    assert done.returncode != 0
    assert f"bind source path does not exist: {missing}" in done.stdout + done.stderr
    assert not missing.exists(), "Docker made no empty folder in its place"


# ---------------------------------------------------------------- the stack, for real


class Stack:
    """docker-compose for one project, with the .env a user on this machine would write."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.site = tmp / "site"
        self.env_file = tmp / ".env"
        self.images: set[str] = set()
        # The folder the test deploys (/models/test): pre-flight reads it through web's mount.
        write_model(tmp / "models" / "test", CONFIGS["test"])
        # Its DFlash drafter, for the speculative side of the losslessness check.
        write_model(tmp / "models" / "test-dflash", CONFIGS["Kimi-K2.6-DFlash"])
        self.values = {
            **LOCAL_IMAGES,
            "APPLIANCE_PANEL_IMAGE": PANEL_IMAGE,
            "APPLIANCE_PANEL_PORT": str(self.port),
            "APPLIANCE_CSRF_TRUSTED_ORIGINS": self.url,
            "APPLIANCE_SITE_DIR": str(self.site),
            "APPLIANCE_MODELS_DIR": str(tmp / "models"),
            "APPLIANCE_ENGINE_NETWORK": f"{PROJECT}-engines",
            "APPLIANCE_HOST_NAME": "e2e-host",
            # No GPUs on this machine: the test engine runs without a GPU request.
            "APPLIANCE_ENGINE_GPU_REQUESTS": "false",
            # A slow load, so there is time to restart the worker and agent during it.
            "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.25,TEST_ENGINE_SHARDS=24",
            "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
            "APPLIANCE_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
        }
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()))

    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        done = subprocess.run(
            [str(COMPOSE), "-p", PROJECT, "-f", str(ROOT / "compose.yaml"),
             "--env-file", str(self.env_file), *args],
            cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: rc {done.returncode}\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout + done.stderr

    def wait_healthy(self, timeout: float = 240) -> float:
        """Healthy and on the engine network: the agent connects a new web container to it
        once, which briefly drops web's published port (appliance/runtime/engine_network.py),
        so a page opened before that may find nothing listening."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self._web_on_engine_network() and self._healthy():
                return time.monotonic() - started
            time.sleep(1)
        raise AssertionError("the panel never became healthy:\n" + self.compose("logs", "--tail",
                                                                                 "60"))

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _web_on_engine_network(self) -> bool:
        """Web and both gateway instances, which relay /v1 to the engines."""
        for service in ("web", "gateway-a", "gateway-b"):
            found = docker.from_env().containers.list(ignore_removed=True, filters={"label": [
                f"com.docker.compose.project={PROJECT}", f"com.docker.compose.service={service}"]})
            if not found or not all(self.values["APPLIANCE_ENGINE_NETWORK"] in
                                    c.attrs["NetworkSettings"]["Networks"] for c in found):
                return False
        return True

    def admin_password(self) -> str:
        """From the web start log, where it stays until the admin first logs in."""
        found = re.findall(ADMIN_PASSWORD, self.compose("logs", "web"))
        assert found and len(set(found)) == 1, "the kept admin password is in the start log"
        return found[0]

    def api(self, token: str, path: str) -> Any:
        response = requests.get(f"{self.url}/api{path}", timeout=10,
                                headers={"Authorization": f"Token {token}"})
        response.raise_for_status()
        return response.json()

    def api_status(self, token: str, path: str) -> int:
        return requests.get(f"{self.url}/api{path}", timeout=10,
                            headers={"Authorization": f"Token {token}"}).status_code

    def psql(self, script: str, timeout: float = 300) -> str:
        """A script run by psql in compose's PostgreSQL (local socket: trust); its output."""
        done = subprocess.run(
            [str(COMPOSE), "-p", PROJECT, "-f", str(ROOT / "compose.yaml"),
             "--env-file", str(self.env_file), "exec", "-T", "postgres", "psql",
             "-U", "appliance", "-d", "appliance", "-v", "ON_ERROR_STOP=1", "-qAt"],
            cwd=ROOT, input=script, capture_output=True, text=True, timeout=timeout,
            check=False)
        assert done.returncode == 0, f"psql: {done.stderr[-2000:]}"
        return done.stdout

    def record_images(self) -> None:
        """Note the engine images this install built, to remove those alone at the end (a
        compose run beside this one builds and uses its own)."""
        table = Deployment._meta.db_table
        self.images |= set(self.psql(
            f"SELECT DISTINCT image FROM {table} WHERE image <> '';").split())


def _site_recipe(site: Path) -> None:
    """A small recipe on the local base whose SGLang source is the test engine's package."""
    source = site / "sglang"
    shutil.copytree(ROOT / "docker" / "test-engine" / "sglang", source / "python" / "sglang")
    commit = commit_all(source, "test engine as an SGLang source tree")
    (site / "recipes").mkdir(parents=True)
    (site / "recipes" / "site-e2e.yaml").write_text(
        "name: site-e2e\nbase_image: appliance-base:bookworm\n"
        f"sglang:\n  git: /site/sglang\n  ref: {commit}\n  flags: sglang-0.5.23\n"
        "patches: []\npip_extras: []\nbuild_args:\n  SGLANG_INSTALL_DEPS: '0'\n"
        # The site lets a spec plant divergences in the test engine (the check's step).
        "env_allow: [TEST_ENGINE_DIVERGE]\n")


def _cleanup(client: Any, images: set[str]) -> None:
    """This project's engines (on its engine network), network and engine images only."""
    for container in client.containers.list(
            all=True, filters={"label": "appliance.instance"}, ignore_removed=True):
        if container.name.startswith("appliance-engine-") and any(
                n.startswith(f"{PROJECT}-engines") for n in
                container.attrs["NetworkSettings"]["Networks"]):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
    for network in client.networks.list(names=[f"{PROJECT}-engines"]):
        network.remove()
    for image in images:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image, force=True)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    if COMPOSE is None:
        pytest.skip("docker-compose not installed")
    client = docker.from_env()
    missing = [tag for tag in LOCAL_IMAGES.values() if not client.images.list(name=tag)]
    if missing:
        pytest.skip(f"local base images missing ({', '.join(missing)}): run "
                    "bash docker/base/make-base-image.sh")
    stack = Stack(tmp_path)
    _site_recipe(stack.site)
    try:
        yield stack
    finally:
        (ARTIFACTS / "compose-logs.txt").parent.mkdir(exist_ok=True)
        (ARTIFACTS / "compose-logs.txt").write_text(stack.compose("logs", check=False))
        with contextlib.suppress(AssertionError):  # already down after a whole run
            stack.record_images()
        stack.compose("down", "-v", check=False)
        _cleanup(client, stack.images)



def _login(page: Page, url: str, password: str) -> None:
    page.goto(f"{url}/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", password)
    page.click("#login")
    expect(page.locator("h1")).to_have_text("Deployments")


def _new_deployment(page: Page, url: str, name: str, self_check: bool, gpu: str = "0") -> int:
    page.goto(f"{url}/deployments/new/")
    page.select_option("#id_recipe", "site-e2e")
    page.fill("#id_name", name)
    page.fill("#id_model_path", "/models/test")
    page.select_option("#id_algorithm", "NONE")
    page.fill("#id_drafter_path", "")
    page.fill("#id_tp_size", "1")
    page.fill("#id_gpu_ids", gpu)
    page.fill("#id_attention_backend", "")
    if not self_check:
        page.uncheck("#id_self_check")
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    expect(page.locator("h1")).to_have_text(name)
    return int(page.url.rstrip("/").split("/")[-1])


def _token(stack: Stack) -> str:
    out = stack.compose("exec", "-T", "web", "python3", "manage.py", "apitoken", "create", "admin")
    return re.findall(r"(sda_[0-9a-f]{64})", out)[0]


def _reaches(engine: Any, host: str, port: int) -> bool:
    """Whether a TCP connection from inside the engine container to host:port succeeds."""
    probe = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])),"
             " timeout=3).close()\nexcept OSError:\n sys.exit(1)")
    return engine.exec_run(["python3", "-c", probe, host, str(port)]).exit_code == 0


def _answers_server_info(url: str) -> bool:
    """Whether the engine's own /server_info answers at url (this machine's outbound proxy
    answers any address it cannot reach, so an answer is checked for the engine's fields)."""
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=3) as response:
            return b"max_total_num_tokens" in response.read()
    except OSError:
        return False


def _reaches_from_outside(client: Any, image: str, address: str) -> bool:
    """Whether a container on Docker's default network gets the engine's /server_info."""
    probe = ("import sys, urllib.request as u\ntry:\n"
             f" body = u.urlopen('http://{address}:30000/server_info', timeout=3).read()\n"
             "except OSError:\n sys.exit(1)\n"
             "sys.exit(0 if b'max_total_num_tokens' in body else 1)")
    container = client.containers.run(image, entrypoint=["python3", "-c", probe], detach=True,
                                      labels={"appliance.test": PROJECT})
    try:
        return int(container.wait(timeout=60)["StatusCode"]) == 0
    finally:
        container.remove(force=True)


def _service(client: Any, service: str) -> Any:
    return client.containers.list(ignore_removed=True, filters={"label": [
        f"com.docker.compose.project={PROJECT}", f"com.docker.compose.service={service}"]})[0]


def _engine_lines(client: Any, name: str) -> list[str]:
    """What the engine printed, stdout and stderr in the order Docker stored them."""
    raw = client.containers.get(name).logs(stdout=True, stderr=True, timestamps=True)
    lines = [line.split(" ", 1)[1] if " " in line else "" for line in raw.decode().split("\n")
             if line]
    # The agent's own /metrics scrapes are not stored (appliance.runtime.follower).
    return [line.rsplit("\r", 1)[-1] for line in lines if not SCRAPE_ACCESS.match(line)]


def _stored_lines(stack: Stack, token: str, pk: int) -> tuple[list[int], list[str]]:
    seqs, texts = [], []
    after = 0
    while True:
        events = stack.api(token, f"/deployments/{pk}/events/?after={after}&limit=1000")["results"]
        if not events:
            return seqs, texts
        for event in events:
            seqs.append(event["seq"])
            # The agent's own notes ("appliance: engine container ... running") come as log
            # lines through the host API (remote_agent: status events are the panel's
            # alone); the engine printed none of them.
            if event["kind"] == "log" and not event["payload"]["text"].startswith("appliance: "):
                texts.append(event["payload"]["text"])
        after = events[-1]["seq"]


def _wait_logged(container: Any, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in container.logs().decode(errors="replace"):
        assert time.monotonic() < deadline, f"{container.name} never logged {text!r}"
        time.sleep(1)


def _wait_status(stack: Stack, token: str, pk: int, status: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while (now := stack.api(token, f"/deployments/{pk}/")["status"]) != status:
        assert time.monotonic() < deadline, f"deployment {pk} is {now}, not {status}"
        time.sleep(1)


def _benchmark(page: Page, stack: Stack, token: str, a: int, b: int) -> list[dict[str, Any]]:
    """Benchmarks -> New -> Run, as a user; short outputs and few prompts keep it seconds."""
    page.goto(f"{stack.url}/benchmarks/new/")
    page.check(f'input[name="deployments"][value="{a}"]')
    page.check(f'input[name="deployments"][value="{b}"]')
    page.select_option("#id_baseline", str(b))
    page.fill("#id_levels", "1,2")
    page.fill("#id_num_prompts", "4")
    page.fill("#id_input_len", "16")
    page.fill("#id_output_len", "16")
    page.click("#run-benchmark")
    expect(page.locator("h1")).to_have_text(re.compile(r"Benchmark #\d+"))
    status = page.locator("#bench-status")
    expect(status).to_have_text(re.compile("^(done|failed|cancelled)$"), timeout=120_000)
    assert status.inner_text() == "done", page.locator("#bench-error").inner_text()
    expect(page.locator("#speedup-table tbody tr")).to_have_count(2)
    expect(page.locator("#bench-error")).to_be_hidden()
    expect(page.locator("#bench-warning")).to_be_hidden()
    page.screenshot(path=screenshot_path("compose-benchmark.png"), full_page=True)
    run = stack.api(token, f"/benchmarks/{page.url.rstrip('/').split('/')[-1]}/")
    assert run["status"] == "done" and run["error"] == "" and run["failed_requests"] == 0
    levels = run["results"]["levels"]
    assert len(levels) == 4, "two deployments, two levels each"
    for level in levels:
        assert (level["completed"], level["errors"]) == (4, 0), level
        assert level["output_throughput"] > 0 and level["tpot_ms"]["mean"] > 0, level
        assert level["total_output_tokens"] == 4 * 16, level
    return [{"target": m["target"], "concurrency": m["concurrency"],
             "output_tok_s": round(m["output_throughput"], 1),
             "req_s": round(m["request_throughput"], 2),
             "tpot_ms": round(m["tpot_ms"]["mean"], 2), "ttft_ms": round(m["ttft_ms"]["mean"], 1)}
            for m in levels]


def _instance(stack: Stack) -> str:
    """The compose install's id, which its engine containers carry (appliance.instance)."""
    table = Installation._meta.db_table
    return stack.psql(f"SELECT instance_id FROM {table} ORDER BY id LIMIT 1;").strip()


def _running(instance: str, pk: int) -> list[Any]:
    return [c for c in engines_of(instance, pk) if c.status == "running"]


def _open_a_busy_log(page: Page, stack: Stack, pk: int) -> dict[str, Any]:
    """EVENTS events into compose's PostgreSQL for a serving deployment (as its engine would
    have logged them), then its page as a user opens it: the tail drawn, live, and pages
    back. The figures are returned to be printed; their targets are bench/log_history.py's
    (this test shares the machine with the suite's others, which moved them past the
    targets' margins)."""
    started = time.monotonic()
    newest = int(stack.psql(fill_sql(deployment_id=pk, count=EVENTS)).split()[0])
    fill_s = time.monotonic() - started
    started = time.monotonic()
    page.goto(f"{stack.url}/deployments/{pk}/")
    expect(page.locator(f'#log .line[data-seq="{newest}"]')).to_be_attached()
    wall_ms = (time.monotonic() - started) * 1000
    tail_ms = page.evaluate('performance.getEntriesByName("log-tail")[0].startTime')
    expect(page.locator("#conn")).to_have_text("live")
    assert page.evaluate("ApplianceLog.stats()")["lines"] >= 500, "the tail, not the history"
    back = sorted(page.evaluate(_TIMED_OLDER, _SCROLL_TOP) for _ in range(PAGES_BACK))
    stats = page.evaluate("ApplianceLog.stats()")
    # Each page back is 200 older lines (half the events are metric points, not lines).
    assert stats["lines"] >= 500 + PAGES_BACK * 200 and stats["first"] < newest - 2000, stats
    page.screenshot(path=screenshot_path("compose-busy-log.png"), full_page=True)
    figures = {"events": EVENTS, "fill_s": round(fill_s, 1), "tail_paint_ms": round(tail_ms),
               "open_wall_ms": round(wall_ms), "page_back_ms_median": round(back[len(back) // 2]),
               "page_back_ms_max": round(back[-1])}
    return figures


def _clone_onto_a_held_gpu(page: Page, stack: Stack, token: str, pk: int) -> int:
    """Clone fills the form with the deployment's spec, GPU included; deploying it as it is
    double-books that GPU and the form refuses, naming the GPU and its holder; on GPU 2 its
    served name is still the holder's, refused by name; renamed on GPU 2 the clone deploys
    with the same spec."""
    original = stack.api(token, f"/deployments/{pk}/")
    page.goto(f"{stack.url}/deployments/{pk}/")
    page.click("#clone")
    expect(page.locator("#clone-note")).to_contain_text(f"#{pk}")
    gpus = ",".join(str(g) for g in original["gpus"])
    expect(page.locator("#id_gpu_ids")).to_have_value(gpus)
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    refusal = page.locator("#field-gpu_ids .field-error")
    expect(refusal).to_contain_text(
        f"GPU {gpus} on host e2e-host is held by deployment #{pk} '{original['name']}' "
        f"({original['status']}); stop it or choose other GPUs.")
    # On a free GPU it is still a second deployment of the served name: refused, naming it.
    page.fill("#id_gpu_ids", "2")
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    expect(page.locator("#field-name .field-error")).to_contain_text(
        f"The served model name '{original['name']}' is already served by deployment #{pk}")
    page.fill("#id_name", "e2e-clone")
    page.fill("#id_gpu_ids", "2")
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    expect(page.locator("h1")).to_have_text("e2e-clone")
    clone = stack.api(token, f"/deployments/{page.url.rstrip('/').split('/')[-1]}/")
    assert clone["gpus"] == [2] and clone["spec"]["engine"] == original["spec"]["engine"]
    return int(clone["id"])


def test_compose_up_runs_the_appliance_as_shipped(stack: Stack, page: Page) -> None:
    client = docker.from_env()
    started = time.monotonic()
    # As a user starts it the first time: the panel image is built by `up` itself.
    stack.compose("up", "-d", "--build", timeout=900)
    stack.wait_healthy()
    up_to_healthy = time.monotonic() - started
    password = stack.admin_password()
    _login(page, stack.url, password)
    ARTIFACTS.mkdir(exist_ok=True)

    # 1. Built from the site recipe; the image's real GPU self-check runs and, with no GPU
    #    here, stops the deployment in seconds, shown in the panel.
    first = _new_deployment(page, stack.url, "e2e-checked", self_check=True)
    expect(page.locator("#build-text")).to_contain_text("step", timeout=120_000)
    expect(page.locator("#selfcheck")).to_be_visible(timeout=180_000)
    expect(page.locator("#status")).to_have_text("failed", timeout=120_000)
    expect(page.locator("#selfcheck-checks")).to_contain_text("nvml")
    expect(page.locator("#log")).not_to_contain_text("gpu-check: {")
    page.screenshot(path=screenshot_path("compose-selfcheck-failed.png"), full_page=True)

    # 2. The same recipe without the self-check: a cache hit, then phases, live.
    created = time.monotonic()
    second = _new_deployment(page, stack.url, "e2e-served", self_check=False)
    expect(page.locator("#build-text")).to_contain_text("already built", timeout=60_000)
    expect(page.locator("#status")).to_have_text("loading", timeout=60_000)
    # The worker and the engine agent restart while the engine loads.
    stack.compose("restart", "worker", "agent")
    expect(page.locator("#status")).to_have_text("ready", timeout=180_000)
    create_to_ready = time.monotonic() - created
    expect(page.locator("#log")).to_contain_text("fired up and ready to roll")
    page.screenshot(path=screenshot_path("compose-ready.png"), full_page=True)
    # A second one to benchmark against, on its own GPU (leases), loading meanwhile.
    third = _new_deployment(page, stack.url, "e2e-served-b", self_check=False, gpu="1")

    token = _token(stack)
    detail = stack.api(token, f"/deployments/{second}/")
    instance = _instance(stack)
    engines = _running(instance, second)
    assert len(engines) == 1, "one engine container, adopted after the restart"
    assert engines[0].labels["appliance.start-token"]
    seqs, stored = _stored_lines(stack, token, second)
    assert seqs == list(range(1, len(seqs) + 1)), "a gap-free event log"
    printed = _engine_lines(client, engines[0].name)
    assert stored == printed[:len(stored)], "every line printed is stored once, in order"
    assert len(stored) >= len(printed) - 5  # the last lines may still be on their way
    assert detail["status"] == "ready"
    # Engines are on the engine network only: no route to Redis or PostgreSQL.
    assert not _reaches(engines[0], "redis", 6379) and not _reaches(engines[0], "postgres", 5432)
    # Nor is an engine reached from the host or from a container off its network, by its
    # address (the network is internal, with no address on the host): only its members.
    network = client.networks.get(stack.values["APPLIANCE_ENGINE_NETWORK"])
    assert network.attrs["Internal"] is True
    address = engines[0].attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
    assert not _answers_server_info(f"http://{address}:30000")
    assert not _reaches_from_outside(client, engines[0].image.id, address)
    assert _reaches(_service(client, "agent"), engines[0].name, 30000)
    # The panel loop (the image's `loop` role) holds its lock and acts: one copy.
    _wait_logged(_service(client, "loop"), "panel loop: acting", 60)

    _wait_status(stack, token, third, "ready")

    # 3. down while the engine serves, up again: history kept, the engine adopted.
    events_before = len(seqs)
    engine_id = engines[0].id
    down = subprocess.run([str(COMPOSE), "-p", PROJECT, "-f", str(ROOT / "compose.yaml"),
                           "--env-file", str(stack.env_file), "down"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert down.returncode == 0, down.stderr
    assert client.containers.get(engine_id).status == "running", "down leaves engines alone"
    stack.compose("up", "-d")
    stack.wait_healthy()
    # The secret key was kept in its volume, so the browser's session is still good.
    page.goto(f"{stack.url}/")
    expect(page.locator("h1")).to_have_text("Deployments")
    # Until the new agent's first heartbeat (it starts once web is healthy) the list says
    # the agent is silent (`unknown`); the list's own refresh shows `ready` once it reports.
    expect(page.locator(f"#deployment-{second} .status")).to_have_text("ready", timeout=30_000)
    time.sleep(3)  # a few agent ticks
    token = _token(stack)
    assert stack.api(token, f"/deployments/{second}/")["status"] == "ready"
    seqs_after, _ = _stored_lines(stack, token, second)
    assert len(seqs_after) >= events_before
    assert [c.id for c in _running(instance, second)] == [engine_id]
    assert stack.api(token, f"/deployments/{first}/")["status"] == "failed"
    # The admin has logged in: the new web container no longer prints the password.
    assert not re.search(ADMIN_PASSWORD, stack.compose("logs", "web"))

    # 3b. A benchmark between the two, from the panel, by the worker the new `up` made
    #     (it joined the engine network at start): real figures, no errors.
    figures = _benchmark(page, stack, token, second, third)

    # 3c. A busy deployment's page: a million events, its tail and pages back.
    busy = _open_a_busy_log(page, stack, third)

    # 3d. Clone it: as it is, the form refuses its held GPU by name; on GPU 2 it deploys.
    _clone_onto_a_held_gpu(page, stack, token, third)

    # 3e. Serving: a key made in the panel, the openai client streaming through the gateway
    #     with it, a chat in the playground, and a losslessness check of a DFLASH deployment
    #     with a planted divergence against e2e-served, found at its token and class.
    served = serve_and_verify(page, url=stack.url, served=second, served_name="e2e-served",
                              other_name="e2e-served-b", spec_gpu="3")

    # 4. Stop from the panel, after its confirm page; the engine and its container go.
    page.goto(f"{stack.url}/deployments/{second}/")
    page.click("#stop")
    expect(page.locator("#confirm-stop")).to_contain_text("takes minutes")
    page.click("#confirm")
    expect(page.locator("#status")).to_have_text("stopped", timeout=60_000)
    assert not engines_of(instance, second)

    # 5. Restart: the same deployment and spec as run 2, a new container, ready again.
    restarted = time.monotonic()
    page.click("#restart")
    expect(page.locator("#status")).to_have_text("ready", timeout=180_000)
    restart_to_ready = time.monotonic() - restarted
    again = stack.api(token, f"/deployments/{second}/")
    assert again["run"] == 2 and again["spec"] == detail["spec"]
    (engine,) = _running(instance, second)
    assert engine.id != engine_id
    assert engine.labels["appliance.start-token"] != engines[0].labels["appliance.start-token"]
    page.reload()
    expect(page.locator("#runs tr[data-run]")).to_have_count(2)

    # 6. Delete the failed one, after its confirm page: gone with its log.
    page.goto(f"{stack.url}/deployments/{first}/")
    page.click("#delete")
    expect(page.locator("#confirm-delete")).to_contain_text("e2e-checked")
    page.click("#confirm")
    expect(page.locator("h1")).to_have_text("Deployments")
    expect(page.locator(f"#deployment-{first}")).to_have_count(0)
    assert stack.api_status(token, f"/deployments/{first}/") == 404

    stack.record_images()
    down = subprocess.run([str(COMPOSE), "-p", PROJECT, "-f", str(ROOT / "compose.yaml"),
                           "--env-file", str(stack.env_file), "down", "-v"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert down.returncode == 0, down.stderr
    timings = {"up_to_healthy_s": round(up_to_healthy, 1),
               "create_to_ready_s": round(create_to_ready, 1),
               "restart_to_ready_s": round(restart_to_ready, 1), "benchmark": figures,
               "busy_log": busy, "serve_and_verify": served}
    (ARTIFACTS / "compose-timings.json").write_text(json.dumps(timings, indent=1))
    print(f"compose timings: {json.dumps(timings, indent=1)}")
