"""The gateway as a process of its own (compose's gateway-a and gateway-b, docs/gateway.md):
/v1 exactly as the panel's web process answers it (web/gateway/proxy.py), keys and routes
read from PostgreSQL and Redis as there, and nothing of the panel beside it.

    uvicorn web.gateway.asgi:application      (docker/panel/entrypoint.sh gateway)

/healthz answers 200 while the process takes requests: the proxy in front
(docker/proxy/haproxy.cfg) sends new requests to the instances whose /healthz answers.
One uvicorn process per instance (no --workers): on SIGTERM uvicorn closes its listening
socket at once, so a new connection is refused (and the proxy retries it on the other
instance) while the requests under way finish, streams included, within
--timeout-graceful-shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")
django.setup(set_prefix=False)

from web.accesslog import quiet_access_log  # noqa: E402 - needs settings loaded
from web.asgitypes import Receive, Scope, Send  # noqa: E402
from web.gateway.proxy import handle  # noqa: E402 - needs the apps loaded
from web.gateway.routing import routing  # noqa: E402

HEALTHY = b'{"ok":true,"role":"gateway"}'
# How long a stopping instance waits for its in-flight counters to reach Redis, once its
# last request ended (they are sent within 10 ms of a change).
COUNTERS_WAIT_S = 2.0


async def _healthz(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(HEALTHY)).encode())]})
    await send({"type": "http.response.body", "body": HEALTHY})


async def _not_here(send: Send, path: str) -> None:
    body = (b'{"error":{"message":"Unknown URL: the gateway serves only /v1 (the panel is '
            b'at the same address, through the proxy).","type":"invalid_request_error",'
            b'"code":"unknown_url"}}')
    await send({"type": "http.response.start", "status": 404, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


_served = {"any": False}


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            # The requests are over (uvicorn waited for them); their in-flight counters'
            # last changes may still be on their way to Redis: a rolling change's drain
            # reads them (docs/fleet.md), so they are waited for, bounded.
            if _served["any"]:
                router = routing()
                router.flush_now()  # a change still waiting on its timer goes now
                pending = {t for t in router.background if not t.done()}
                if pending:
                    with contextlib.suppress(Exception):
                        await asyncio.wait(pending, timeout=COUNTERS_WAIT_S)
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return  # no websockets here
    path = scope.get("path", "")
    if path == "/v1" or path.startswith("/v1/"):
        _served["any"] = True
        await handle(scope, receive, send)
    elif path == "/healthz":
        await _healthz(send)
    else:
        await _not_here(send, path)


from web.security import require_production_secrets  # noqa: E402 - needs settings loaded

# As web's: a well-known secret key (sessions, the playground's calls) is refused at start.
require_production_secrets()
quiet_access_log()
