"""Real processes for end-to-end tests: the ASGI panel (uvicorn), a Celery worker, the
engine agent and the panel loop, pointed at the test database that pytest-django created."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import requests
from django.conf import settings
from django.db import connection

import docker
from tests.fleet.simhosts import gateway
from web.fleet.tokenfiles import own_host_token_keep

ROOT = Path(__file__).resolve().parent.parent
_SECRET_KEY = secrets.token_urlsafe(48)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def suite_database_url() -> str:
    # Not named test_*: a module importing it would have pytest collect it as a test.
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def process_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        APPLIANCE_DATABASE_URL=suite_database_url(),
        # The web server refuses a known secret; a real one, as a user's install has.
        APPLIANCE_SECRET_KEY=_SECRET_KEY,
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="web.settings",
    )
    env.update(extra)
    return env


@contextmanager
def panel_server(log_path: Path, bind: str = "127.0.0.1", **env: str) -> Iterator[str]:
    """The panel on a free port of `bind` (0.0.0.0: simulated hosts in containers reach it at
    their network's gateway, tests/fleet/simhosts.py); yields its loopback URL."""
    port = free_port()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "web.asgi:application", "--host", bind,
             "--port", str(port), "--log-level", "warning"],
            cwd=ROOT, env=process_env(**env), stdout=log, stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_http(f"{url}/healthz", proc, log_path)
            yield url
        finally:
            _end(proc)


@contextmanager
def celery_worker(log_path: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    argv = ["-m", "celery", "-A", "worker.celery", "worker", "--pool", "threads",
            "--concurrency", "4", "--loglevel", "INFO", "--without-heartbeat",
            "--without-gossip", "--without-mingle"]
    with _process(argv, log_path, "ready.", env) as proc:
        yield proc


@contextmanager
def engine_agent(log_path: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """The engine agent as the compose service runs it: `python3 -m worker.agent`."""
    with _process(["-m", "worker.agent"], log_path, "engine agent", env) as proc:
        yield proc


def own_host_token(state_dir: Path) -> Path:
    """The own host's join token written to its file under `state_dir`, as the panel loop
    keeps it (off the test's thread: a browser test's loop makes the ORM refuse there)."""
    token_file = state_dir / "own-host" / "token"

    def keep() -> None:
        try:
            own_host_token_keep(path=token_file, host_name=str(settings.HOST_NAME))
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(keep).result(timeout=30)
    return token_file


def bridge_address() -> str:
    """This machine's address on Docker's bridge, where a host's agent here publishes its
    engines for the test process and the panel's workers."""
    client = docker.from_env()
    try:
        return gateway(client.networks.get("bridge"))
    finally:
        client.close()


@contextmanager
def own_host_agent(log_path: Path, panel_url: str, state_dir: Path, **env: str
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """The panel's own host's agent as compose runs it: `python3 -m worker.agent` with
    APPLIANCE_PANEL_URL, the program every joined host runs, with no database, broker or
    panel secret in its environment. It joins with the own host's token in its file
    (own_host_token: its start waits on no loop), keeps its credential under `state_dir`
    and publishes its engines on the bridge address."""
    agent_env = {"APPLIANCE_PANEL_URL": panel_url, "APPLIANCE_HOST_NAME": settings.HOST_NAME,
                 "APPLIANCE_JOIN_TOKEN_FILE": str(own_host_token(state_dir)),
                 "APPLIANCE_HOST_CREDENTIAL_FILE": str(state_dir / "host-credential"),
                 "APPLIANCE_HOST_ADVERTISE_ADDR": bridge_address(), "APPLIANCE_GPU_COUNT": "8",
                 **env}
    with _process(["-m", "worker.agent"], log_path, "fleet agent for host", agent_env,
                  panel_side=False) as proc:
        yield proc


@contextmanager
def panel_loop(log_path: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """The panel loop as the compose service runs it: `python3 -m worker.loop` (rolling
    changes' steps, dead builds' re-queue, the Tune sweep, retention: web/loop.py)."""
    with _process(["-m", "worker.loop"], log_path, "panel loop running", env) as proc:
        yield proc


@contextmanager
def _process(argv: list[str], log_path: Path, ready_line: str, env: dict[str, str],
             panel_side: bool = True) -> Iterator[subprocess.Popen[bytes]]:
    """A Python process of the appliance on the test database (a host's agent, not
    panel-side, on none: no database, broker or secret), ready once its log says so."""
    environ = process_env(**env)
    if not panel_side:
        for name in ("APPLIANCE_DATABASE_URL", "APPLIANCE_REDIS_URL", "APPLIANCE_SECRET_KEY",
                     "DJANGO_SETTINGS_MODULE"):
            environ.pop(name, None)
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=environ,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_log(log_path, ready_line, proc)
            yield proc
        finally:
            _end(proc)


def _wait_http(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):  # a first answer slow under load
            time.sleep(0.2)
    raise RuntimeError(f"server did not start: {log_path.read_text()[-2000:]}")


def _wait_log(log_path: Path, needle: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited: {log_path.read_text()[-2000:]}")
        if needle in log_path.read_text():
            return
        time.sleep(0.2)
    raise RuntimeError(f"worker did not start: {log_path.read_text()[-2000:]}")


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def login_session(url: str, username: str, password: str) -> requests.Session:
    """A requests session logged in to the panel through its login form (CSRF included)."""
    session = requests.Session()
    page = session.get(f"{url}/login/", timeout=10)
    token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    answer = session.post(
        f"{url}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/login/"}, timeout=10)
    assert answer.status_code == 200 and "Log out" in answer.text, "the login form let us in"
    return session


@contextmanager
def redis_server(data_dir: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server of a test's own, persisting to an append-only file as compose's."""
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--appendonly", "yes",
         "--dir", str(data_dir), "--save", ""], stdout=subprocess.DEVNULL)
    for _ in range(50):
        if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                          check=False).stdout.strip() == b"PONG":
            break
        time.sleep(0.1)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def redis_shutdown(port: int) -> None:
    subprocess.run(["redis-cli", "-p", str(port), "shutdown"], check=False, capture_output=True)


PG_DATA = "/var/lib/appliance-test/pgdata"  # the test script's own server (setup-and-run.sh)


def pg_ctl(*args: str) -> None:
    """pg_ctl on the test script's PostgreSQL server (root only: it runs as postgres)."""
    pg_bin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    # Output to the server's log file: the restarted server would hold a pipe open forever.
    log = "/var/lib/appliance-test/postgres.log"
    subprocess.run(["su", "postgres", "-c",
                    f"{pg_bin}/pg_ctl -D {PG_DATA} -l {log} {' '.join(args)}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
