"""The host API's ingest answered on the ASGI path, before Django (docs/performance.md, "Log
path through the host API").

A busy host posts a batch of its engines' events every 50 ms or so per engine
(appliance/runtime/host_sink.py `RemoteSink`): the panel's hottest write. Through Django
it crossed the WSGI bridge's thread hop and the whole middleware list (sessions, CSRF,
auth, messages, WhiteNoise, axes), none of which a host's credential uses. Here the same
request runs the same function as the Django view (hostapi.events_ingest: the credential,
the body, the lease, the fields, the placement and start checks, the one-statement store)
on a small thread pool of its own, and is answered with the same status and JSON body, and
with the headers the middleware would have added to it (the security headers of the
settings; none of the others writes a header on this answer).

What the middleware would refuse or turn is its own, sent to Django before a byte of the
body is read: a Host header not in ALLOWED_HOSTS, a plain-HTTP request while
SECURE_SSL_REDIRECT is on, DISALLOWED_USER_AGENTS in use, a mounted prefix (root_path), a
body without a Content-Length (or chunked). A Content-Length over
DATA_UPLOAD_MAX_MEMORY_SIZE is refused here as web/limits.py refuses it (413, the same
body), before the body is read. Nothing of the request (the credential, the body) is
logged: an unexpected failure is logged by its type and the deployment's id alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections
from django.http.request import split_domain_port, validate_host
from django.urls import reverse

from web.asgitypes import ASGIApp, Headers, Receive, Scope, Send
from web.limits import body_refusal_of

from . import hostapi

log = logging.getLogger(__name__)

# Batches stored at once per process: each holds a pooled database connection while it runs
# (under the pool's size, APPLIANCE_DB_POOL_MAX_SIZE, beside Django's own requests).
INGEST_THREADS = 4
_MAX_ID_DIGITS = 18  # a deployment id PostgreSQL's bigint holds; a longer one is Django's


class HostIngest:
    """An ASGI app answering the host API's ingest (POST .../deployments/<id>/events/),
    Django (`django_app`) the rest."""

    def __init__(self, django_app: ASGIApp) -> None:
        self.django_app = django_app
        path = reverse("fleet-host-events", kwargs={"deployment_id": 0})
        self.prefix, _, rest = path.partition("/0/")
        self.prefix += "/"
        self.suffix = "/" + rest
        self.enabled = (settings.HOST_INGEST_BEFORE_DJANGO
                        and not settings.DISALLOWED_USER_AGENTS)
        self.executor = ThreadPoolExecutor(max_workers=INGEST_THREADS,
                                           thread_name_prefix="ingest")
        self.headers = _security_headers()
        self.frame_options = (b"x-frame-options", str(settings.X_FRAME_OPTIONS).upper().encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = self._eligible(scope) if self.enabled else None
        if request is None:
            await self.django_app(scope, receive, send)
            return
        deployment_id, length, authorization, session = request
        refused = body_refusal_of(length)
        if refused is not None:  # web/limits.py's: no middleware after it adds a header
            await self._send(send, refused, scope, framed=False)
            return
        raw = await _body(receive, int(length))
        if raw is None:  # the client went away mid-body
            return
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self.executor, _ingest, authorization, session,
                                            deployment_id, raw)
        await self._send(send, answer, scope)

    def _eligible(self, scope: Scope) -> tuple[int, str, str, str] | None:
        """(deployment id, Content-Length, Authorization, X-Agent-Session) of a request
        answered here; None for one that is Django's."""
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or scope.get("root_path")):
            return None
        path: str = scope.get("path", "")
        if not (path.startswith(self.prefix) and path.endswith(self.suffix)):
            return None
        digits = path[len(self.prefix):len(path) - len(self.suffix)]
        if not (digits.isascii() and digits.isdigit() and len(digits) <= _MAX_ID_DIGITS):
            return None
        if settings.SECURE_SSL_REDIRECT and not _secure(scope):
            return None  # SecurityMiddleware's redirect: Django's
        host, length, authorization, session = "", None, "", ""
        for name, value in scope.get("headers", []):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"content-length":
                length = value.decode("latin-1")
            elif name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-agent-session":
                session = value.decode("latin-1").strip()
            elif name == b"transfer-encoding":
                return None
        if not length or not _host_allowed(host):
            return None
        return int(digits), length, authorization, session

    async def _send(self, send: Send, answer: hostapi.Answer, scope: Scope, *,
                    framed: bool = True) -> None:
        status, body = answer
        data = json.dumps(body, cls=DjangoJSONEncoder).encode()
        headers: Headers = [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *self.headers]
        if framed:
            headers.append(self.frame_options)
        if status == 401:
            headers.append((b"www-authenticate", hostapi.AUTHENTICATE.encode()))
        if settings.SECURE_HSTS_SECONDS and _secure(scope):
            headers.append((b"strict-transport-security", _hsts().encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def with_host_ingest(django_app: ASGIApp) -> ASGIApp:
    return HostIngest(django_app)


def _ingest(authorization: str, session: str, deployment_id: int,
            raw: bytes) -> hostapi.Answer:
    """hostapi.events_ingest on this pool's thread, its database connection handed back
    to the pool after it (as Django's request_finished does)."""
    close_old_connections()
    try:
        return hostapi.events_ingest(authorization=authorization, session=session,
                                     deployment_id=deployment_id, raw=raw)
    except Exception as exc:  # noqa: BLE001 - answered, and logged without the request
        log.error("the ingest of deployment %s failed: %s", deployment_id,
                  type(exc).__name__)
        return 500, {"detail": "The panel failed to store this batch; send it again."}
    finally:
        close_old_connections()


async def _body(receive: Receive, length: int) -> bytes | None:
    """The request's body, as long as its Content-Length says; None if the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False) or size > length:
            return b"".join(chunks)


def _secure(scope: Scope) -> bool:
    """HttpRequest.is_secure: HTTPS, or the proxy's header that says so where one is set."""
    if scope.get("scheme") == "https":
        return True
    proxy: Any = settings.SECURE_PROXY_SSL_HEADER
    if not proxy:
        return False
    header, secure = proxy
    name = header.removeprefix("HTTP_").lower().replace("_", "-").encode()
    for key, value in scope.get("headers", []):
        if key == name:
            return bool(value.decode("latin-1").split(",", 1)[0].strip() == secure)
    return False


def _host_allowed(host: str) -> bool:
    """Django's check of the Host header (HttpRequest.get_host): the names it refuses are
    Django's to answer (400)."""
    domain, _ = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _security_headers() -> Headers:
    """What SecurityMiddleware adds to a JSON answer, from the settings (HSTS, for an HTTPS
    request only, is added per request; X-Frame-Options is XFrameOptionsMiddleware's)."""
    headers: list[tuple[bytes, bytes]] = []
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    policy: Any = settings.SECURE_REFERRER_POLICY
    if policy:
        values = policy.split(",") if isinstance(policy, str) else policy
        headers.append((b"referrer-policy", ",".join(v.strip() for v in values).encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append((b"cross-origin-opener-policy",
                        settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
    return headers


def _hsts() -> str:
    value = f"max-age={settings.SECURE_HSTS_SECONDS}"
    if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
        value += "; includeSubDomains"
    if settings.SECURE_HSTS_PRELOAD:
        value += "; preload"
    return value
