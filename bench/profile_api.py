"""Where a status read's time goes, in process and without contention: N requests, one
after another, to /healthz, the deployment detail and the summary (token auth), through
the panel's ASGI app as uvicorn calls it (web.asgi.application), and through Django's
WSGI handler alone (no a2wsgi hop); the µs per request of each, and a cProfile of the
WSGI path grouped by layer (auth, permissions, the row's query, serializing, rendering,
middleware, the rest of Django and DRF). Beside them, the same PostgreSQL's own cost of
one round trip (`SELECT 1` through psycopg) and of the row's query alone.

    python bench/profile_api.py [--requests 2000] [--database-url ...] [--redis-url ...]

Production settings (DEBUG off, the shipped pool); the deployment is bench/load_api.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import _loadkit as kit

# What a frame's file says about the layer it belongs to (the first match wins, so the
# specific places come before the framework they are called from).
LAYERS = [
    ("auth: token", ("accounts/auth.py", "knox/")),
    ("permissions", ("accounts/backends.py", "contrib/auth/", "deployments/permissions.py",
                     "rest_framework/permissions.py")),
    ("serializing", ("rest_framework/serializers.py", "rest_framework/fields.py",
                     "rest_framework/relations.py", "deployments/selectors.py", "api/fast.py")),
    ("rendering", ("rest_framework/renderers.py", "rest_framework/utils/encoders.py", "json/",
                   "orjson")),
    ("database", ("django/db/", "psycopg/", "psycopg_pool/")),
    ("middleware", ("django/middleware/", "contrib/sessions/", "contrib/messages/",
                    "whitenoise/", "axes/", "web/limits.py", "django/utils/deprecation.py")),
    ("DRF view machinery", ("rest_framework/",)),
    ("Django handler, URLs", ("django/core/handlers/", "django/urls/", "django/http/")),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kit.add_common_args(parser)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--top", type=int, default=0, help="also print the top N functions")
    args = parser.parse_args()
    os.environ.pop("APPLIANCE_DEBUG", None)
    os.environ.setdefault("APPLIANCE_SECRET_KEY", "profile-" + "x" * 50)
    kit.setup_django(args)
    import load_api

    _, token = kit.bench_user()
    pk = load_api.seed_deployment(args.events)
    auth = {"HTTP_AUTHORIZATION": f"Token {token}"}
    paths = {"/healthz": "/healthz", "detail": f"/api/deployments/{pk}/",
             "summary": f"/api/deployments/{pk}/summary/"}
    print(f"command: {kit.command_line()}\nload: {uptime()}")
    print(f"\nµs per request, {args.requests} in a row (median of 3 batches)")
    print(f"{'':10} {'ASGI app':>10} {'WSGI only':>10} {'ASGI, 304':>10} {'queries':>8}")
    asgi = AsgiCaller()
    for name, path in paths.items():
        print(f"{name:10} {timings(asgi, path, token, auth, args.requests)}")
    print(f"\nCPU µs per request through the ASGI app, {args.requests} in a row: this process "
          "(all threads) and PostgreSQL's server processes of this database (/proc)")
    print(f"{'':10} {'web':>8} {'pg':>8} {'total':>8} {'x /healthz':>11}")
    costs = {name: cpu_per_request(lambda p=path: asgi.get(p, token), args.requests)
             for name, path in paths.items()}
    for name, (web, pg) in costs.items():
        ratio = sum(costs["/healthz"]) / (web + pg)
        print(f"{name:10} {web:>8.0f} {pg:>8.0f} {web + pg:>8.0f} {ratio:>11.2f}")
    print(f"{'PostgreSQL':10} SELECT 1: {per_request(select_one, args.requests):.0f} µs, "
          f"the row's query: {per_request(lambda: row_query(pk), args.requests):.0f} µs "
          "(psycopg through Django's connection, in a row)")
    for name in ("detail", "summary"):
        layers(paths[name], auth, args.requests, args.top)


def timings(asgi: AsgiCaller, path: str, token: str, auth: dict[str, str], n: int) -> str:
    etag = None if path == "/healthz" else wsgi_get(path, auth)["ETag"]
    via_asgi = per_request(lambda: asgi.get(path, token), n)
    via_wsgi = per_request(lambda: wsgi_get(path, auth), n)
    conditional = per_request(lambda: asgi.get(path, token, etag), n) if etag else float("nan")
    return (f"{via_asgi:>10.0f} {via_wsgi:>10.0f} {conditional:>10.0f} "
            f"{queries_of(path, auth):>8}")


class AsgiCaller:
    """web.asgi.application called as uvicorn calls it, on one event loop."""

    def __init__(self) -> None:
        from web.asgi import application

        self.app = application
        self.loop = asyncio.new_event_loop()

    def get(self, path: str, token: str, etag: str | None = None) -> int:
        return self.loop.run_until_complete(self._get(path, token, etag))

    async def _get(self, path: str, token: str, etag: str | None) -> int:
        headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Token {token}".encode()),
                   *([(b"if-none-match", etag.encode())] if etag else [])]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "headers": headers,
                 "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
        sent: list[dict[str, Any]] = []
        asked = False

        async def receive() -> dict[str, Any]:
            nonlocal asked
            if asked:
                await asyncio.Event().wait()  # the client stays: no disconnect
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        return int(sent[0]["status"])


def wsgi_get(path: str, headers: dict[str, str], etag: str | None = None) -> Any:
    client = _client()
    extra = dict(headers, **({"HTTP_IF_NONE_MATCH": etag} if etag else {}))
    return client.get(path, **extra)


_CLIENT: Any = None


def _client() -> Any:
    global _CLIENT
    if _CLIENT is None:
        from django.test import Client

        _CLIENT = Client()
    return _CLIENT


def per_request(call: Callable[[], Any], n: int) -> float:
    """Median over 3 batches of the µs per call."""
    batches = []
    for _ in range(3):
        began = time.perf_counter()
        for _ in range(n // 3 or 1):
            call()
        batches.append((time.perf_counter() - began) / (n // 3 or 1) * 1e6)
    return sorted(batches)[1]


def cpu_per_request(call: Callable[[], Any], n: int) -> tuple[float, float]:
    """CPU µs per call of this process and of PostgreSQL's processes for this database."""
    call()
    web, pg = time.process_time(), pg_cpu()
    for _ in range(n):
        call()
    return (time.process_time() - web) / n * 1e6, (pg_cpu() - pg) / n * 1e6


def pg_cpu() -> float:
    """CPU seconds so far of the server processes connected to this database (the server
    runs on this host; a process that is gone is not counted)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        pids = [pid for (pid,) in cursor.fetchall()]
    return kit.cpu_seconds(pids)


def queries_of(path: str, headers: dict[str, str]) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        wsgi_get(path, headers)
    return len(captured.captured_queries)


def select_one() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def row_query(pk: int) -> None:
    from web.deployments import selectors

    list(selectors.deployment_list(versioned=True).filter(pk=pk))


def layers(path: str, headers: dict[str, str], n: int, top: int) -> None:
    """cProfile of n WSGI requests; own time of each function summed by layer."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(n):
        wsgi_get(path, headers)
    profile.disable()
    stats = pstats.Stats(profile)
    by_layer: dict[str, float] = {}
    total = 0.0
    for (filename, _, _), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        layer = next((name for name, marks in LAYERS
                      if any(mark in filename for mark in marks)), "other")
        by_layer[layer] = by_layer.get(layer, 0.0) + own
        total += own
    print(f"\n{path}: own time by layer, µs per request (cProfile's overhead included, "
          f"{total / n * 1e6:.0f} µs in all)")
    for layer, seconds in sorted(by_layer.items(), key=lambda item: -item[1]):
        print(f"  {layer:24} {seconds / n * 1e6:>7.0f}  {seconds / total:>4.0%}")
    if top:
        out = io.StringIO()
        order = os.environ.get("PROFILE_SORT", "cumulative")  # or tottime
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
        print(out.getvalue())


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
