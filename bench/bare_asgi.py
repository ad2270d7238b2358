"""The reference under the panel's figures: a bare ASGI app that answers every request with
/healthz's body, served by the same server with the same options as the panel
(`docker/panel/entrypoint.sh serve bare_asgi:app`, bench/load_api.py). Nothing is faster
than this through that server, so it is the floor under /healthz."""

from __future__ import annotations

from typing import Any

BODY = b'{"ok": true}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
