"""The status reads' one statement: a token's row, its user's standing, whether
the user may view deployments, and the deployment's shown columns, in one round trip,
prepared on each pooled connection.

Through the ORM a token read was three queries (token, permissions, row), each compiled
by Django and parsed and planned by PostgreSQL: about 3 ms of CPU against /healthz's
0.8 ms. Here the SQL is made once per process from the models' metadata, and psycopg
prepares it after prepare_threshold runs on a connection (settings.DATABASES), so a read
costs PostgreSQL an execution of a kept plan. The decisions
(digest, expiry, role) stay in Python beside the code they mirror (web/accounts/auth.py,
web/deployments/permissions.py); this module only reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from hmac import compare_digest
from typing import Any

import psycopg
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.http import HttpRequest
from django.utils import timezone
from knox.crypto import hash_token
from knox.models import AuthToken

from web.accounts.auth import token_accepted, token_in_header, token_key
from web.accounts.models import TokenScope
from web.deployments.models import Deployment, StatusBody
from web.deployments.permissions import ROLE_PERMISSIONS, VIEW_PERMISSION
from web.deployments.silence import Silence, row_silence
from web.fleet.models import FleetHost

Converter = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class StatusRow:
    """One token with this token key, and what a read needs to decide and answer."""

    digest: str
    expiry: datetime | None
    user_active: bool
    user_superuser: bool
    may_view: bool  # the user's own or a group's permission (a superuser's aside)
    role: str | None  # the token's scope; None for a token made before scopes
    deployment: Deployment | None  # None: no deployment with that id, or `stored` is its read
    version: str | None = None  # the row's version (xmin); None: no deployment with that id
    # The read's body as the row's writers stored it at this version (StatusBody), when the
    # statement asked for it and it is current; the row's columns are then not read.
    stored: bytes | None = None
    # The agent watching the row is silent (web/deployments/silence.py): the read shows
    # `unknown`, whatever was stored.
    silence: Silence | None = None


@dataclass(frozen=True)
class _Statement:
    sql: str
    attnames: list[str]  # the deployment's columns, in the model's field order
    converters: list[tuple[int, list[Converter]]]
    expression: dict[int, Any]  # the column expression each converter is given
    stored: bool  # the statement reads a stored body (StatusBody) after the version


_STATEMENTS: dict[tuple[tuple[str, ...], str | None], _Statement] = {}
_HEAD = 6  # digest, expiry, is_active, is_superuser, may_view, role; then xmin
# After xmin: what the silence check reads (status, agent_id and the agent's last host
# report), whatever the read's fields.
_WATCH = 3


def deployment_status_read(*, token_key: str, deployment_id: int, permission: str,
                           fields: Sequence[str]) -> list[StatusRow]:
    """Each stored token whose key is `token_key` (knox's lookup; one in practice), with its
    user, whether the user holds `permission` ("app_label.codename") and the deployment
    `deployment_id` with only `fields` loaded and its row version (`row_version`, the
    ETag's, as selectors.deployment_list(versioned=True) gives it)."""
    sql, params = status_query(token_key=token_key, deployment_id=deployment_id,
                               permission=permission, fields=fields)
    connection.ensure_connection()
    # Django's wrapper (its error mapping, its query log, execute_wrapper) around a
    # server-binding psycopg cursor on the request's connection: only such a cursor can be
    # prepared, whatever OPTIONS["server_side_binding"] makes the product's own.
    with _wrapped(psycopg.Cursor(connection.connection)) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return status_rows(rows=rows, fields=fields, wrapper=connection)


def status_query(*, token_key: str, deployment_id: int, permission: str,
                 fields: Sequence[str], stored: str | None = None) -> tuple[str, list[Any]]:
    """deployment_status_read's SQL and parameters, for a caller with its own connection
    (web/api/asgi.py's, async); its rows go through status_rows (the same `fields` and
    `stored`). With `stored` ("detail" or "summary", a StatusBody column), each row also
    has that body where it was stored at the row's current version, and then none of the
    row's columns (NULLs: nothing to decode)."""
    app_label, codename = permission.split(".", 1)
    return (_statement(tuple(fields), stored).sql,
            [app_label, codename, deployment_id, token_key])


def status_body_query(*, token_key: str, deployment_id: int, permission: str,
                      stored: str) -> tuple[str, list[Any]]:
    """status_query with `stored` and none of the row's shown columns (only its id), in
    asyncpg's numbered placeholders, for web/api/asgi.py's asyncpg pool: its rows go
    through status_rows with no fields, and where `stored` is None in them the caller reads
    the row with status_query."""
    sql, params = status_query(token_key=token_key, deployment_id=deployment_id,
                               permission=permission, fields=(), stored=stored)
    return _numbered(sql), params


@cache
def _numbered(sql: str) -> str:
    """psycopg's %s placeholders as asyncpg's $1, $2, ... (the SQL has no other %)."""
    parts = sql.split("%s")
    return "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], 1)) + parts[-1]


def status_rows(*, rows: Sequence[Sequence[Any]], fields: Sequence[str], wrapper: Any,
                stored: str | None = None) -> list[StatusRow]:
    """The statement's rows as StatusRows, the deployment's columns converted as the ORM
    does on `wrapper` (a DatabaseWrapper of the database they came from)."""
    statement = _statement(tuple(fields), stored)
    return [_row(statement, row, wrapper) for row in rows]


def _wrapped(cursor: psycopg.Cursor[Any]) -> Any:
    if connection.queries_logged:
        return connection.make_debug_cursor(cursor)  # type: ignore[arg-type]  # a DB-API cursor
    return connection.make_cursor(cursor)  # type: ignore[arg-type]


def _row(statement: _Statement, row: Sequence[Any], wrapper: Any) -> StatusRow:
    version, *values = row[_HEAD:]
    status, agent_id, seen = values[:_WATCH]
    del values[:_WATCH]
    silence = None if version is None else row_silence(
        status=str(status or ""), agent_id=str(agent_id or ""), last_seen=seen,
        now=timezone.now())
    body = values.pop(0) if statement.stored else None
    deployment = None
    if version is not None and body is None:
        for i, converters in statement.converters:
            for convert in converters:
                values[i] = convert(values[i], statement.expression[i], wrapper)
        deployment = Deployment.from_db(wrapper.alias, statement.attnames, values)
        deployment.row_version = version  # type: ignore[attr-defined]
        deployment.shown_silence = silence  # type: ignore[attr-defined]  # bodies.py reads it
    return StatusRow(digest=row[0], expiry=row[1], user_active=row[2], user_superuser=row[3],
                     may_view=row[4], role=row[5], deployment=deployment, version=version,
                     stored=None if body is None else bytes(body), silence=silence)


def _statement(fields: tuple[str, ...], stored: str | None = None) -> _Statement:
    made = _STATEMENTS.get((fields, stored))
    if made is None:
        made = _STATEMENTS[fields, stored] = _make(fields, stored)
    return made


def _make(fields: tuple[str, ...], stored: str | None) -> _Statement:
    """The SQL from the models' tables and columns (made once per process and field set)."""
    q = connection.ops.quote_name
    shown = [f for f in Deployment._meta.concrete_fields if f.name in fields or f.primary_key]
    alias = "d"
    columns = ", ".join(f"{alias}.{q(f.column or f.attname)}" for f in shown)
    body, body_join = "", ""
    if stored is not None:
        if stored not in ("detail", "summary"):
            raise ValueError(f"no stored body {stored!r}: detail or summary")
        # The body only where it was rendered from this version of the row; the row's
        # columns only where it was not (a NULL costs neither PostgreSQL's output nor a
        # decode here).
        body = f"b.{q(stored)}, "
        body_join = (f"LEFT JOIN {q(StatusBody._meta.db_table)} b ON b.{q('deployment_id')} "
                     f"= {alias}.{q(Deployment._meta.pk.column or 'id')} "
                     f"AND b.{q('version')} = {alias}.xmin::text")
        columns = ", ".join(f"CASE WHEN b.{q('deployment_id')} IS NULL THEN "
                            f"{alias}.{q(f.column or f.attname)} END" for f in shown)
    table = {f.name: q(f.column or f.attname) for f in Deployment._meta.concrete_fields
             if f.name in ("status", "agent_id")}
    watch = (f"{alias}.{table['status']}, {alias}.{table['agent_id']}, "
             f"(SELECT h.{q('heartbeat_at')} FROM "
             f"{q(FleetHost._meta.db_table)} h "
             f"WHERE h.{q('agent_id')} = {alias}.{table['agent_id']} "
             f"ORDER BY h.{q('heartbeat_at')} DESC LIMIT 1), ")
    user = get_user_model()
    token_table, scope_table = AuthToken._meta.db_table, TokenScope._meta.db_table
    user_perms = User.user_permissions.through._meta.db_table
    user_groups = User.groups.through._meta.db_table
    group_perms = Group.permissions.through._meta.db_table
    sql = f"""
        SELECT t.{q("digest")}, t.{q("expiry")}, u.{q("is_active")}, u.{q("is_superuser")},
          EXISTS (
            SELECT 1 FROM {q(Permission._meta.db_table)} p
            JOIN {q(ContentType._meta.db_table)} c ON c.{q("id")} = p.{q("content_type_id")}
            WHERE c.{q("app_label")} = %s AND p.{q("codename")} = %s AND (
              EXISTS (SELECT 1 FROM {q(user_perms)} up
                      WHERE up.{q("user_id")} = u.{q("id")}
                        AND up.{q("permission_id")} = p.{q("id")})
              OR EXISTS (SELECT 1 FROM {q(user_groups)} ug
                         JOIN {q(group_perms)} gp
                           ON gp.{q("group_id")} = ug.{q("group_id")}
                         WHERE ug.{q("user_id")} = u.{q("id")}
                           AND gp.{q("permission_id")} = p.{q("id")}))),
          s.{q("role")}, {alias}.xmin::text, {watch}{body}{columns}
        FROM {q(token_table)} t
        JOIN {q(user._meta.db_table)} u ON u.{q("id")} = t.{q("user_id")}
        LEFT JOIN {q(scope_table)} s ON s.{q("token_id")} = t.{q("digest")}
        LEFT JOIN {q(Deployment._meta.db_table)} {alias}
          ON {alias}.{q(Deployment._meta.pk.column or "id")} = %s
        {body_join}
        WHERE t.{q("token_key")} = %s"""
    converters: list[tuple[int, list[Converter]]] = []
    expression: dict[int, Any] = {}
    for i, field in enumerate(shown):
        col = field.get_col(alias)
        found = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if found:
            converters.append((i, found))
            expression[i] = col
    return _Statement(sql=" ".join(sql.split()), attnames=[f.attname for f in shown],
                      converters=converters, expression=expression,
                      stored=stored is not None)


def deployment_for_token(*, request: HttpRequest, deployment_id: int,
                         fields: Sequence[str]) -> Deployment | None:
    """The deployment a GET with an API token may view, read in one statement; None
    whenever the answer is anything but the deployment (no token header, a token that is
    unknown, expired or renewed, an inactive user, no view permission, no such
    deployment): the caller then takes the whole way (DRF's authentication, permissions
    and get_object), where each of those answers and side effects (an expired token's
    deletion) is made, so they stay exactly as they are."""
    token = token_in_header(request)
    if token is None or connection.vendor != "postgresql":
        return None
    rows = deployment_status_read(token_key=token_key(token), deployment_id=deployment_id,
                                  permission=VIEW_PERMISSION, fields=fields)
    return status_readable(token=token, rows=rows)


def status_readable(*, token: str, rows: Sequence[StatusRow]) -> Deployment | None:
    """The deployment of `rows` (deployment_status_read's for `token`) that the token may
    view with nothing written; None for every other answer (deployment_for_token)."""
    row = status_row_readable(token=token, rows=rows)
    return None if row is None else row.deployment


def status_row_readable(*, token: str, rows: Sequence[StatusRow]) -> StatusRow | None:
    """The row of `rows` whose deployment (or stored body) the token may view with nothing
    written; None for every other answer (status_readable)."""
    digest = hash_token(token)
    row = next((r for r in rows if compare_digest(digest, r.digest)), None)
    if row is None or row.version is None or not token_accepted(
            digest=digest, stored_digest=row.digest, expiry=row.expiry,
            user_active=row.user_active):
        return None
    # User.has_perm (an active superuser holds every permission, web.accounts.backends
    # the rest), then the token's scope (web.deployments.permissions: at most its role's).
    held = row.user_superuser or row.may_view
    scoped = row.role is None or VIEW_PERMISSION in ROLE_PERMISSIONS.get(row.role, frozenset())
    return row if held and scoped else None
