"""What the panel load benchmarks share: a database and a panel to aim at, a small
asyncio HTTP/1.1 client, PostgreSQL connection counts, percentiles.

The panel runs as the panel image runs it (`uvicorn web.asgi:application`, one process,
production settings with a real secret key); --app-dir serves another checkout of the
code with the same database and Redis, to compare before and after a change.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://appliance@127.0.0.1:5432/appliance_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
BENCH_USER = "bench"
BENCH_PASSWORD = "bench-pass-1-not-secret"


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default=os.environ.get(
        "APPLIANCE_DATABASE_URL", DEFAULT_DATABASE_URL),
        help="PostgreSQL database (made and migrated when missing)")
    parser.add_argument("--redis-url", default=os.environ.get(
        "APPLIANCE_REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--url", default="", help="a panel already running on this "
                        "database (default: start one with uvicorn)")
    parser.add_argument("--app-dir", type=Path, default=ROOT,
                        help="the checkout to serve (default: this one)")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the started panel (repeatable)")


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


# ------------------------------------------------------------------ database


def setup_django(args: argparse.Namespace) -> None:
    """This process writes through the same services the panel uses."""
    os.environ["APPLIANCE_DATABASE_URL"] = args.database_url
    os.environ["APPLIANCE_REDIS_URL"] = args.redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
    sys.path.insert(0, str(ROOT))
    _create_database(args.database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _create_database(url: str) -> None:
    import psycopg

    name = urlparse(url).path.lstrip("/")
    with psycopg.connect(_admin_dsn(url), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _admin_dsn(url: str) -> str:
    parsed = urlparse(url)
    return parsed._replace(path="/postgres").geturl().replace("postgres://", "postgresql://", 1)


def bench_user() -> tuple[Any, str]:
    """A user with the viewer's rights and an API token."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    from web.accounts.tokens import token_create

    user, made = get_user_model().objects.get_or_create(username=BENCH_USER)
    if made:
        user.set_password(BENCH_PASSWORD)
        user.save()
    viewer, _ = Group.objects.get_or_create(name="viewer")
    viewer.permissions.add(Permission.objects.get(codename="view_deployment"))
    user.groups.add(viewer)
    return user, token_create(username=BENCH_USER)[1]


def bench_deployment(name: str) -> Any:
    """A deployment row only: nothing is queued or started for it."""
    from web.deployments.models import Deployment

    return Deployment.objects.create(
        name=name, spec={"name": name}, recipe="bench", algorithm="DDTREE", gpus=[0])


PANEL_APP_NAME = "appliance-bench-panel"  # the started panel's sessions carry it (PGAPPNAME)


class PgConnections:
    """Counts the panel's sessions on the database by state (pg_stat_activity), from
    outside Django; a panel this script did not start is counted with all other sessions."""

    def __init__(self, args: argparse.Namespace) -> None:
        import psycopg

        self.name = urlparse(args.database_url).path.lstrip("/")
        self.app = "" if args.url else PANEL_APP_NAME
        self.dsn = _admin_dsn(args.database_url)
        self.conn = psycopg.connect(self.dsn, autocommit=True)

    def count(self) -> dict[str, int]:
        import psycopg

        try:
            return self._count()
        except psycopg.OperationalError:  # a restarted server: count on a new session
            self.conn = psycopg.connect(self.dsn, autocommit=True)
            return self._count()

    def _count(self) -> dict[str, int]:
        rows = self.conn.execute(
            "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND (%s = '' OR application_name = %s) GROUP BY 1",
            [self.name, self.app, self.app]).fetchall()
        counts = {state: n for state, n in rows}
        counts["total"] = sum(n for _, n in rows)
        return counts

    def close(self) -> None:
        self.conn.close()


def settle(pg: PgConnections, target: int, limit_s: float) -> dict[str, int]:
    """Wait (up to limit_s) for the session count to come down to target."""
    deadline = time.monotonic() + limit_s
    counts = pg.count()
    while counts["total"] > target and time.monotonic() < deadline:
        time.sleep(0.25)
        counts = pg.count()
    return counts


def show_counts(counts: dict[str, int]) -> str:
    parts = [f"{state} {n}" for state, n in sorted(counts.items()) if state != "total"]
    return f"{counts['total']} ({', '.join(parts) or 'none'})"


# --------------------------------------------------------------------- panel


@contextmanager
def panel(args: argparse.Namespace, log_path: Path) -> Iterator[str]:
    """The panel's base URL: args.url, or a uvicorn started like the panel image's."""
    if args.url:
        yield args.url.rstrip("/")
        return
    port = _free_port()
    env = dict(os.environ)
    env.pop("APPLIANCE_DEBUG", None)
    env.update(
        APPLIANCE_DATABASE_URL=args.database_url, APPLIANCE_REDIS_URL=args.redis_url,
        APPLIANCE_SECRET_KEY=secrets.token_urlsafe(48), DJANGO_SETTINGS_MODULE="web.settings",
        PYTHONUNBUFFERED="1", PGAPPNAME=PANEL_APP_NAME)
    env.update(item.split("=", 1) for item in args.server_env)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "web.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning"],
            cwd=args.app_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, log_path)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log_path: Path, *,
                 timeout_s: float = 30) -> None:
    """Until the server started as `proc` answers /healthz (its log's tail if it never does)."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the panel exited: {log_path.read_text()[-2000:]}")
        try:
            if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):  # a first answer slow under load
            time.sleep(0.2)
    raise SystemExit(f"the panel did not start: {log_path.read_text()[-2000:]}")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes so far (/proc/PID/stat; the gone are not counted)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def login_cookie(url: str) -> str:
    """A session cookie for the bench user, by the login form (the SSE view is the panel's)."""
    import requests

    session = requests.Session()
    page = session.get(f"{url}/login/", timeout=10)
    token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    answer = session.post(
        f"{url}/login/", timeout=10,
        data={"username": BENCH_USER, "password": BENCH_PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/login/"})
    if "sessionid" not in session.cookies:
        raise SystemExit(f"login failed: HTTP {answer.status_code}")
    return f"sessionid={session.cookies['sessionid']}"


# -------------------------------------------------------------- HTTP client


class HttpError(Exception):
    pass


class Http:
    """One keep-alive HTTP/1.1 connection; enough of the protocol for the panel's answers."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def get(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        """Send a GET and read the status and headers; the body is read separately."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        lines = [f"GET {path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        self.writer.write("\r\n".join(lines).encode("latin-1"))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        answer = {}
        for line in header_lines:
            if ":" in line:
                name, value = line.split(":", 1)
                answer[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), answer

    async def body(self, headers: dict[str, str]) -> bytes:
        assert self.reader is not None
        if "content-length" in headers:
            return await self.reader.readexactly(int(headers["content-length"]))
        parts = [chunk async for chunk in self.chunks()]
        return b"".join(parts)

    async def chunks(self) -> Any:
        """The chunks of a chunked body, as they arrive."""
        assert self.reader is not None
        while True:
            line = await self.reader.readline()
            if not line:
                raise ConnectionResetError("the server closed the connection mid-body")
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                await self.reader.readline()
                return
            data = await self.reader.readexactly(size + 2)
            yield data[:-2]


# ------------------------------------------------------------------- figures


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# ------------------------------------------------------- the clients' own limit

# A client process that used this share of a core or more over a figure's window was
# (or may have been) the limit: its figure is not printed.
CLIENT_BOUND_SHARE = 0.85


def load_average() -> str:
    """The machine's 1/5/15-minute load average, as `uptime` gives it."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def client_verdict(cpu_s: list[float], wall_s: float) -> tuple[str, bool]:
    """The client processes' CPU over a window (`cpu_s`, one each) as a column ("0.41+0.38
    cores"), and whether one of them was near a full core: then the client, not the
    server, may have set the figure."""
    shares = [cpu / wall_s if wall_s > 0 else 0.0 for cpu in cpu_s]
    text = "+".join(f"{share:.2f}" for share in shares) + " cores"
    return text, any(share >= CLIENT_BOUND_SHARE for share in shares)


def run_fast(coro: Any) -> Any:
    """asyncio.run on uvloop's loop where it is installed: a client that spends less per
    request becomes the limit later."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
