"""Which of Django's two handlers serves a request (web/asgi.py).

Under ASGI, Django runs a sync view on a new thread per request and moves between that
thread and the event loop around the view and the sync-only middleware (issue 22's
profile: /healthz at 6-7x the cost of a bare ASGI app, most of it thread creation and those
hops). Django's WSGI handler runs the same middleware, view and signals in one thread of a
pool, without them. So the panel's requests for sync views (the REST API, the pages) go to
the WSGI handler through a2wsgi, the ASGI-to-WSGI adapter uvicorn's docs point to (a
bounded thread pool fed from uvicorn's loop), and the async views (the SSE streams, the log
download), which must not hold a thread while they stream, stay on ASGI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from a2wsgi import WSGIMiddleware
from asgiref.sync import iscoroutinefunction
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application
from django.urls import Resolver404, resolve

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
# Requests in a view at once per process; more wait for a thread. Under the database pool
# (APPLIANCE_DB_POOL_MAX_SIZE, 20), so a sync view never waits for a connection.
WSGI_THREADS = 10


def django_application() -> ASGIApp:
    """Django as one ASGI app: sync views through WSGI, async views through ASGI."""
    asgi = get_asgi_application()
    wsgi = WSGIMiddleware(get_wsgi_application(), workers=WSGI_THREADS)  # type: ignore[arg-type]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not view_is_async(scope["path"]):
            await wsgi(scope, receive, send)  # type: ignore[arg-type]
        else:
            await asgi(scope, receive, send)
    return app


def view_is_async(path: str) -> bool:
    """Whether the view at `path` is a coroutine function (a path that matches none is
    Django's 404, answered as well by either handler)."""
    try:
        return iscoroutinefunction(resolve(path).func)
    except Resolver404:
        return False
