"""Which of Django's two handlers serves a request (web/asgi.py).

Under ASGI, Django runs a sync view on a new thread per request and moves between that
thread and the event loop around the view and the sync-only middleware (a profile,
docs/performance.md: /healthz at 6-7x the cost of a bare ASGI app, most of it thread
creation and those hops). Django's WSGI handler runs the same middleware, view and signals
in one thread of a pool, without them. So the panel's requests for sync views (the REST
API, the pages) go to the WSGI handler through a2wsgi, the ASGI-to-WSGI adapter uvicorn's
docs point to (a bounded thread pool fed from uvicorn's loop), and the async views (the SSE
streams, the log download), which must not hold a thread while they stream, stay on ASGI.

a2wsgi sends each message of the answer from the thread and waits there for the event loop
to take it (the start, the body, the end: three waits on the loop per request, then the
thread's own return), which was half of /healthz's CPU in a profile of it
(threading's Condition wait and notify, the futures chaining them; uvicorn with httptools
answers a bare app 8x faster than Django answered /healthz). WSGIBridge runs the handler
the same way, on a bounded pool with a2wsgi's environ and request body, but a response
that is not streamed comes back to the loop once, with its body; a streamed one
(StreamingHttpResponse, FileResponse: WhiteNoise's files) is sent piece by piece from the
thread as a2wsgi does.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial
from typing import Any

from a2wsgi.wsgi import Body, build_environ
from asgiref.sync import iscoroutinefunction
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application
from django.urls import Resolver404, resolve

from web.asgitypes import ASGIApp

# Requests in a view at once per process; more wait for a thread. Under the database pool
# (APPLIANCE_DB_POOL_MAX_SIZE, 20), so a sync view never waits for a connection.
WSGI_THREADS = 10


def django_application() -> ASGIApp:
    """Django as one ASGI app: sync views through WSGI, async views through ASGI."""
    asgi = get_asgi_application()
    wsgi = WSGIBridge(get_wsgi_application(), workers=WSGI_THREADS)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not view_is_async(scope["path"]):
            await wsgi(scope, receive, send)
        else:
            await asgi(scope, receive, send)
    return app


@lru_cache(maxsize=4096)
def view_is_async(path: str) -> bool:
    """Whether the view at `path` is a coroutine function (a path that matches none is
    Django's 404, answered as well by either handler). The URL patterns are fixed for the
    process and no middleware sets another urlconf, so a path's answer never changes: it
    is resolved once (profiled: resolve() was 23 µs of /healthz's ~450, and
    Django resolves the path again in its handler), the latest 4,096 paths kept. Either
    handler answers any view (a stale answer, after a test's override of ROOT_URLCONF,
    would cost speed, not correctness)."""
    try:
        return iscoroutinefunction(resolve(path).func)
    except Resolver404:
        return False


Message = dict[str, Any]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WSGIBridge:
    """A WSGI app as an ASGI app: each request handled whole in a thread of a bounded pool
    (the view, the middleware, and the response's close(), whose request_finished hands
    the thread's database connection back to the pool), the answer sent by the loop."""

    def __init__(self, app: WSGIApp, *, workers: int) -> None:
        self.app = app
        self.executor = ThreadPoolExecutor(thread_name_prefix="WSGI", max_workers=workers)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        environ: Any = build_environ(scope, Body(loop, receive))  # the body, read when asked
        context = contextvars.copy_context()
        handle = partial(context.run, self._handle, environ, loop, send)
        answer: list[Message] = await loop.run_in_executor(self.executor, handle)
        for message in answer:
            await send(message)

    def _handle(self, environ: dict[str, Any], loop: asyncio.AbstractEventLoop,
                send: Any) -> list[Message]:
        """The messages left for the loop to send: all of them for a buffered response,
        none for a streamed one (sent from here as they come)."""
        response = _Response()
        iterable = self.app(environ, response.start_response)
        try:
            if getattr(iterable, "streaming", True) is False:  # Django's HttpResponse
                body = b"".join([*response.written, *iterable])
                return [response.start(), {"type": "http.response.body", "body": body}]
            self._stream(response, iterable, loop, send)
            return []
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()

    @staticmethod
    def _stream(response: _Response, iterable: Iterable[bytes],
                loop: asyncio.AbstractEventLoop, send: Any) -> None:
        def out(message: Message) -> None:
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        for chunk in iterable:
            if not response.sent:
                out(response.start())
                for written in response.written:
                    out({"type": "http.response.body", "body": written, "more_body": True})
            out({"type": "http.response.body", "body": chunk, "more_body": True})
        if not response.sent:
            out(response.start())
        out({"type": "http.response.body", "body": b""})


class _Response:
    """What a WSGI app's start_response said, kept until the answer goes out."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.written: list[bytes] = []  # WSGI's write() callable, before the body
        self.sent = False

    def start_response(self, status: str, headers: list[tuple[str, str]],
                       exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info is not None and self.sent:
            raise exc_info[1].with_traceback(exc_info[2])  # PEP 3333: too late to change
        self.status = int(status.split(" ", 1)[0])
        self.headers = [(name.strip().encode("latin1").lower(), value.strip().encode("latin1"))
                        for name, value in headers]
        return self.written.append

    def start(self) -> Message:
        self.sent = True
        return {"type": "http.response.start", "status": self.status, "headers": self.headers}
