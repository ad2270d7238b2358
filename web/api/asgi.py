"""The status reads' token GETs answered on the ASGI path, before Django
(docs/performance.md, Status API).

A token GET of a deployment's detail or summary was one prepared statement inside Django
(web/api/views.status_read), but still went through the WSGI bridge's thread and the whole
middleware list: about 1,470 µs of server CPU a read against /healthz's 440 µs. Here the
same requests (GET, no query string, a plain JSON Accept, a numeric id, `Authorization:
Token ...`, no cookie, no body) run the same statement on an async psycopg pool and are
answered with the same body and ETag (304 for a matching If-None-Match) and with exactly
the headers Django gave the same kind of answer: those are learnt, per read, status, host
and scheme, from a real answer of Django's to such a request (the first one; Django answers
it, and it is taken only when its status, ETag and body are the ones computed here), so
whatever the middleware adds comes from the middleware itself.

A row whose watching agent is silent (web/deployments/silence.py) is Django's too: the
statement reads the agent's last report with the row, and Django's read answers `unknown`.

Anything else goes to Django unchanged, before anything is sent: no row the token may read
(unknown, expired or renewed token, inactive user, no permission or scope, no deployment:
Django's 401/403/404 and an expired token's deletion stay its own), a precondition other
than If-None-Match, an error of any kind.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from django.conf import settings
from django.db import connections
from django.urls import reverse
from django.utils.http import parse_etags
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg_pool import AsyncConnectionPool

from web.accounts.auth import token_key, token_well_formed
from web.asgitypes import ASGIApp, Headers, Receive, Scope, Send
from web.deployments.bodies import READ_FIELDS, STATUS_READS, status_body_render, status_etag_of
from web.deployments.permissions import VIEW_PERMISSION
from web.deployments.prom import STATUS_READS_ANSWERED

from .selectors import (
    StatusRow,
    status_body_query,
    status_query,
    status_row_readable,
    status_rows,
)
from .views import PLAIN_JSON

log = logging.getLogger(__name__)

# Who answered each status read (the /metrics counter appliance_status_reads_total).
_BY_DJANGO = STATUS_READS_ANSWERED.labels("django")
_STORED = STATUS_READS_ANSWERED.labels("asgi_stored")
_RENDERED = STATUS_READS_ANSWERED.labels("asgi_rendered")


def _installed(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


# asyncpg, when installed: the stored-body statement's driver (psycopg otherwise).
_ASYNCPG = _installed("asyncpg")

# Connections per process for these reads: one runs a statement at a time, in about 0.3 ms
# of PostgreSQL's time; a few keep the two cores busy without crowding Django's pool.
POOL_SIZE = 4
POOL_TIMEOUT_S = 5.0  # then the read is Django's, which has its own pool
# Learnt header sets kept (read, status, host, scheme, forwarded host and scheme): bounded,
# since a client picks its Host header; past it, such requests are Django's.
MAX_TEMPLATES = 64
# A request header any of these names: Django's (a precondition, a body, a session).
_DJANGO_ONLY = frozenset({b"cookie", b"if-match", b"if-unmodified-since", b"if-modified-since",
                          b"content-length", b"transfer-encoding", b"range", b"if-range"})


class StatusReads:
    """An ASGI app answering the status reads' token GETs, Django (`django_app`) the rest."""

    def __init__(self, django_app: ASGIApp) -> None:
        self.django_app = django_app
        self.enabled = (settings.STATUS_READS_BEFORE_DJANGO
                        and str(settings.DATABASES["default"]["ENGINE"]).endswith("postgresql")
                        and not settings.DISALLOWED_USER_AGENTS)
        # The router's URLs: /api/deployments/<pk>/ and /api/deployments/<pk>/summary/.
        detail = reverse("deployment-detail", kwargs={"pk": 0})
        summary = reverse("deployment-summary", kwargs={"pk": 0})
        self.prefix = detail[:detail.index("/0/") + 1]
        self.suffixes = {detail[len(self.prefix) + 1:]: "deployment-detail",
                         summary[len(self.prefix) + 1:]: "deployment-summary"}
        self.templates: dict[tuple[Any, ...], Headers] = {}
        self.pools: dict[int, AsyncConnectionPool] = {}
        self.fast_pools: dict[int, Any] = {}  # asyncpg's, where it is installed
        self.wrapper: Any = None  # a DatabaseWrapper for the ORM's column converters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        read = self._eligible(scope) if self.enabled else None
        if read is None:
            if self._status_path(scope):
                _BY_DJANGO.inc()
            await self.django_app(scope, receive, send)
            return
        url_name, pk, token, key, if_none_match = read
        try:
            answer = await self._answer(url_name, pk, token, if_none_match)
        except Exception:  # noqa: BLE001 - whatever it was, Django answers (and logs) it
            log.debug("status read left to Django", exc_info=True)
            answer = None
        if answer is None:
            _BY_DJANGO.inc()
            await self.django_app(scope, receive, send)
            return
        status, etag, body, stored = answer
        template = self.templates.get((*key, status))
        if template is None:
            _BY_DJANGO.inc()
            await self._learn(scope, receive, send, (*key, status), etag, body)
            return
        (_STORED if stored else _RENDERED).inc()
        headers = [(name, etag if name == b"etag" else
                    str(len(body)).encode() if name == b"content-length" else value)
                   for name, value in template]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _status_path(self, scope: Scope) -> bool:
        """Whether the request's path is a status read's (whoever answers it)."""
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(self.prefix):
            return False
        pk, slash, rest = path[len(self.prefix):].partition("/")
        return slash + rest in self.suffixes and pk.isdigit()

    def _eligible(self, scope: Scope) -> tuple[str, int, str, tuple[Any, ...], str | None] | None:
        """(URL name, id, token, template key, If-None-Match) of a request answered here;
        None for one that is Django's."""
        if (scope["type"] != "http" or scope.get("method") != "GET" or scope.get("query_string")
                or scope.get("root_path")):
            return None
        path: str = scope.get("path", "")
        if not path.startswith(self.prefix):
            return None
        pk, slash, rest = path[len(self.prefix):].partition("/")
        url_name = self.suffixes.get(slash + rest)
        if (url_name is None or not (pk.isascii() and pk.isdigit() and len(pk) <= 18)
                or pk.startswith("0") and pk != "0"):  # "01": Django's own resolution
            return None
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", ()):
            if name in headers or name in _DJANGO_ONLY:
                return None  # a repeated header: Django joins them, leave it to Django
            headers[name] = value
        auth = headers.get(b"authorization", b"").split()
        if len(auth) != 2 or auth[0].lower() != b"token" or not token_well_formed(auth[1]):
            return None
        if headers.get(b"accept", b"*/*").decode("latin-1") not in PLAIN_JSON:
            return None
        none_match = headers.get(b"if-none-match")
        key = (url_name, scope.get("scheme"), headers.get(b"host"),
               headers.get(b"x-forwarded-host"), headers.get(b"x-forwarded-proto"))
        return (url_name, int(pk), auth[1].decode(), key,
                None if none_match is None else none_match.decode("latin-1"))

    async def _answer(self, url_name: str, pk: int, token: str,
                      if_none_match: str | None) -> tuple[int, bytes, bytes, bool] | None:
        """(status, ETag, body, whether the body was the stored one) as the status read's
        view answers, or None: Django's."""
        action, name, _ = STATUS_READS[url_name]
        fields = READ_FIELDS[action]
        # With the body the row's writers stored at its current version, if they did
        # (web/deployments/services/reads.py): then nothing is decoded or serialized here.
        sql, params = status_query(token_key=token_key(token), deployment_id=pk,
                                   permission=VIEW_PERMISSION, fields=fields, stored=name)
        row = None
        if _ASYNCPG is not None:
            # The stored body alone, on asyncpg (a third of psycopg's CPU per statement);
            # where none is current, the row is read below as before.
            row = await self._stored_read(pk, token, name)
            if row is None or row.silence is not None:
                return None
        if row is None or row.stored is None:
            pool = await self._pool()
            async with pool.connection() as conn, conn.cursor(binary=True) as cursor:
                await cursor.execute(sql, params, prepare=True)
                rows = await cursor.fetchall()
            row = status_row_readable(token=token, rows=status_rows(
                rows=rows, fields=fields, wrapper=self.wrapper, stored=name))
        if row is None or row.version is None or row.silence is not None:
            return None  # a silent agent's row: Django's read shows it `unknown` (bodies.py)
        etag = status_etag_of(pk=pk, version=row.version, name=name)
        if _not_modified(if_none_match, etag):
            return 304, etag.encode("latin-1"), b"", row.stored is not None
        if row.stored is not None:
            return 200, etag.encode("latin-1"), row.stored, True
        if row.deployment is None:
            return None
        return 200, etag.encode("latin-1"), status_body_render(deployment=row.deployment,
                                                               url_name=url_name), False

    async def _pool(self) -> AsyncConnectionPool:
        """This event loop's pool, on Django's connection parameters (its adapters: JSON
        and timestamps load as the ORM's converters expect them)."""
        loop_id = id(asyncio.get_running_loop())
        pool = self.pools.get(loop_id)
        if pool is None:
            if self.wrapper is None:
                self.wrapper = connections.create_connection("default")
            params = dict(self.wrapper.get_connection_params())
            params.pop("cursor_factory", None)  # Django's sync cursor class
            params.setdefault("application_name", "status-reads")  # in pg_stat_activity
            pool = self.pools[loop_id] = AsyncConnectionPool(
                kwargs={**params, "autocommit": True}, min_size=1, max_size=POOL_SIZE,
                timeout=POOL_TIMEOUT_S, open=False, name="status-reads",
                configure=_jsonb_as_text)
        await pool.open()  # once; the pool's lock makes a second call wait, then return
        return pool

    async def _stored_read(self, pk: int, token: str, name: str) -> StatusRow | None:
        """The token's row with the stored `name` body where it is current (asyncpg)."""
        sql, params = status_body_query(token_key=token_key(token), deployment_id=pk,
                                        permission=VIEW_PERMISSION, stored=name)
        pool = await self._fast_pool()
        async with pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
            rows = await conn.fetch(sql, *params)  # prepared once per connection (its cache)
        return status_row_readable(token=token, rows=status_rows(
            rows=rows, fields=(), wrapper=self.wrapper, stored=name))

    async def _fast_pool(self) -> Any:
        """This event loop's asyncpg pool, on Django's connection parameters."""
        loop_id = id(asyncio.get_running_loop())
        opened = self.fast_pools.get(loop_id)
        if opened is not None and opened.done() and opened.exception() is not None:
            opened = None  # it could not open (the database down): the next read tries again
        if opened is None:
            if self.wrapper is None:
                self.wrapper = connections.create_connection("default")
            params = self.wrapper.get_connection_params()
            # A task: the requests that come while it opens wait for the same one.
            opened = self.fast_pools[loop_id] = asyncio.ensure_future(_ASYNCPG.create_pool(
                host=params.get("host") or None, port=params.get("port") or None,
                user=params.get("user"), password=params.get("password"),
                database=params.get("dbname"), ssl=params.get("sslmode"),
                min_size=1, max_size=POOL_SIZE, reset=_kept_as_it_is,
                server_settings={"application_name": "status-reads"}))
        return await opened

    async def close(self) -> None:
        """Close this event loop's pools (a test's loop; the server's live as the process)."""
        pool = self.pools.pop(id(asyncio.get_running_loop()), None)
        if pool is not None:
            await pool.close()
        fast = self.fast_pools.pop(id(asyncio.get_running_loop()), None)
        if fast is not None:
            await (await fast).close()

    async def _learn(self, scope: Scope, receive: Receive, send: Send, key: tuple[Any, ...],
                     etag: bytes, body: bytes) -> None:
        """Django answers this request; its headers are kept for this kind of answer when
        it is the one computed here (status, ETag, body)."""
        started: dict[str, Any] = {}
        parts: list[bytes] = []

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.update(message)
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
            await send(message)

        await self.django_app(scope, receive, watch)
        headers: Headers = [(bytes(n).lower(), bytes(v)) for n, v in started.get("headers", [])]
        # A cookie set would be one client's: such an answer is never a template.
        same = (started.get("status") == key[-1] and b"".join(parts) == body
                and dict(headers).get(b"etag") == etag
                and all(name != b"set-cookie" for name, _ in headers))
        if same and len(self.templates) < MAX_TEMPLATES:
            self.templates[key] = headers


class _JsonbBinaryText(Loader):
    """jsonb in binary format as its text, as Django's adapters load it in text format
    (its JSONField decodes the text): the binary cursor would otherwise hand the converter
    a decoded object, which it refuses."""

    format = Format.BINARY

    def load(self, data: Any) -> str:
        return bytes(data[1:]).decode()  # a version byte (1), then the JSON text


async def _jsonb_as_text(connection: Any) -> None:
    connection.adapters.register_loader("jsonb", _JsonbBinaryText)


async def _kept_as_it_is(connection: Any) -> None:
    """A connection given back to the asyncpg pool: its default reset (UNLISTEN, RESET
    ALL, ...) is a round trip per read, and these connections only ever run the one
    statement outside a transaction, so there is nothing to reset (an open transaction
    would still be rolled back by the pool itself)."""


def _not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether a GET with this If-None-Match is answered 304 for `etag`, as Django's
    get_conditional_response decides it (RFC 9110's weak comparison, `*` matching any);
    the other preconditions never reach this path (_DJANGO_ONLY). Without the header
    nothing is parsed: building the HttpRequest Django's function reads cost about a fifth
    of a read's CPU here."""
    if not if_none_match:
        return False
    etags = parse_etags(if_none_match)
    if etags == ["*"]:
        return True
    target = etag.strip("W/")
    return any(tag.strip("W/") == target for tag in etags)


def with_status_reads(django_app: ASGIApp) -> ASGIApp:
    """The panel's Django app with the status reads' token GETs answered before it."""
    return StatusReads(django_app)
