"""The status reads' answers stored by the deployment row's writers
(web/deployments/services/reads.py): rendered from the row as each write leaves it, kept
with the row's version, read in the token statement only while that version is current."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection
from rest_framework.test import APIClient

from appliance.runtime import series
from appliance.runtime.alerts import Alert
from tests.specs import spec
from web.accounts.auth import token_key
from web.api.selectors import StatusRow, status_body_query, status_query, status_rows
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.bodies import READ_FIELDS
from web.deployments.models import Deployment, StatusBody
from web.deployments.permissions import VIEW_PERMISSION
from web.deployments.selectors import deployment_list
from web.deployments.services.metrics import deployment_apply_alerts, metrics_store_point
from web.deployments.services.reads import deployment_status_bodies_store

pytestmark = pytest.mark.django_db(transaction=True)  # stored after each writer's commit
READS = {"": ("retrieve", "detail"), "summary/": ("summary", "summary")}


def _version(pk: int) -> str:
    return str(deployment_list(versioned=True).get(pk=pk).row_version)


def _django_answers(token: str, pk: int) -> dict[str, bytes]:
    """The bodies Django's own view renders from the row now (the reference)."""
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    answers = {}
    for read, (_, name) in READS.items():
        answer = api.get(f"/api/deployments/{pk}/{read}")
        assert answer.status_code == 200
        answers[name] = answer.content
    return answers


def _stored_read(token: str, pk: int, read: str) -> StatusRow:
    """The token statement with the stored body, as web/api/asgi.py runs it."""
    action, name = READS[read]
    sql, params = status_query(token_key=token_key(token), deployment_id=pk,
                               permission=VIEW_PERMISSION, fields=READ_FIELDS[action],
                               stored=name)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    [row] = status_rows(rows=rows, fields=READ_FIELDS[action], wrapper=connection, stored=name)
    return row


def _writes(pk: int) -> list[Callable[[], Any]]:
    """What the engine agent and the panel write while an engine serves."""
    point = series.MetricPoint(t=1_790_000_000.0, throughput=1234.5, accept_len=4.2,
                               gpus=[[90.0, 70.0, 80.0]])
    stall = Alert("stall", "firing", "warning", "no progress")
    return [
        lambda: metrics_store_point(deployment_id=pk, point=point, resolution_s=2),
        lambda: deployment_apply_alerts(deployment_id=pk, alerts=[stall]),
        lambda: services.events_append(deployment_id=pk, events=[
            ("log", {"text": "Decode batch. #running-req: 8"})]),
        lambda: deployment_apply_alerts(deployment_id=pk, alerts=[
            Alert("stall", "resolved", "warning", "progress again")]),
        lambda: services.deployment_mark_building(deployment_id=pk),
    ]


def test_each_writer_stores_the_reads_answers_as_django_renders_them_for_its_row(
        viewer: Any, token_for: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    token = token_for(viewer)
    for write in [lambda: None, *_writes(deployment.pk)]:
        write()
        stored = StatusBody.objects.get(pk=deployment.pk)
        assert stored.version == _version(deployment.pk)
        expected = _django_answers(token, deployment.pk)
        assert bytes(stored.detail) == expected["detail"]
        assert bytes(stored.summary) == expected["summary"]
        for read, (_, name) in READS.items():
            row = _stored_read(token, deployment.pk, read)
            # Nothing of the row is decoded: the bytes are the answer.
            assert row.stored == expected[name] and row.deployment is None
            assert row.version == stored.version
    assert b'"alert_history":[{' in expected["summary"]
    assert b'"throughput":1234.5' in expected["summary"]


def test_an_agents_batches_store_the_answers_at_most_twice_a_second_and_once_more_when_quiet(
        viewer: Any, token_for: Any) -> None:
    from web.deployments.services.events import STATUS_BODIES_EVERY_S

    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    token = token_for(viewer)
    pk = deployment.pk

    def batch(n: int) -> None:  # as the agent's follower ships a decode line
        decode = {"kind": "decode_stats", "gen_throughput": 100.0 + n, "running_req": 8}
        services.events_append_batch(
            deployment_id=pk, events=[("log", {"text": f"Decode batch {n}"}),
                                      ("metric", decode)],
            row={"log_cursor": f"cursor-{n}", "decode_stats": decode})

    batch(1)
    assert StatusBody.objects.get(pk=pk).version == _version(pk)  # the first one stores
    assert bytes(StatusBody.objects.get(pk=pk).detail) == _django_answers(token, pk)["detail"]
    batch(2)  # within STATUS_BODIES_EVERY_S: not stored, so the reads render the row
    assert StatusBody.objects.get(pk=pk).version != _version(pk)
    assert _stored_read(token, pk, "").stored is None
    services.events_batches_quiet(deployment_id=pk)  # the follower's second without a batch
    stored = StatusBody.objects.get(pk=pk)
    assert stored.version == _version(pk)
    assert bytes(stored.summary) == _django_answers(token, pk)["summary"]
    services.events_batches_quiet(deployment_id=pk)  # nothing since: nothing to store
    assert StatusBody.objects.get(pk=pk).version == stored.version
    time.sleep(STATUS_BODIES_EVERY_S)
    batch(3)  # a batch after the interval stores again
    assert StatusBody.objects.get(pk=pk).version == _version(pk)


def test_a_write_by_any_other_path_leaves_the_stored_answers_unused(
        viewer: Any, token_for: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    token = token_for(viewer)
    before = StatusBody.objects.get(pk=deployment.pk)
    Deployment.objects.filter(pk=deployment.pk).update(name="renamed")  # no writer's hook
    assert StatusBody.objects.get(pk=deployment.pk).version == before.version != _version(
        deployment.pk)
    for read in READS:
        row = _stored_read(token, deployment.pk, read)
        assert row.stored is None and row.deployment is not None
        assert row.deployment.name == "renamed" and row.version == _version(deployment.pk)


def test_answers_rendered_before_a_write_that_lands_in_between_are_not_stored(
        viewer: Any, token_for: Any) -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    stored_before = StatusBody.objects.get(pk=deployment.pk).version
    dsn = connection.get_connection_params()

    def write_first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith(f"INSERT INTO {connection.ops.quote_name(StatusBody._meta.db_table)}"):
            # Another session's write, committed after the row was read and rendered.
            with psycopg.connect(**{k: v for k, v in dsn.items() if k != "cursor_factory"},
                                 autocommit=True) as other:
                other.execute("UPDATE deployments_deployment SET name = 'raced' WHERE id = %s",
                              [deployment.pk])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(write_first):
        assert deployment_status_bodies_store(deployment_id=deployment.pk) is False
    assert StatusBody.objects.get(pk=deployment.pk).version == stored_before
    for read in READS:
        row = _stored_read(token_for(viewer), deployment.pk, read)
        assert row.stored is None and row.deployment is not None
        assert row.deployment.name == "raced"


def test_a_deleted_deployment_takes_its_stored_answers_with_it() -> None:
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    assert StatusBody.objects.filter(pk=deployment.pk).exists()
    Deployment.objects.filter(pk=deployment.pk).update(status="stopped")
    services.deployment_delete(deployment_id=deployment.pk)
    assert not StatusBody.objects.filter(pk=deployment.pk).exists()
    assert deployment_status_bodies_store(deployment_id=deployment.pk) is False


def test_the_asyncpg_statement_reads_the_stored_body_and_only_the_current_one(
        viewer: Any, token_for: Any) -> None:
    asyncpg = pytest.importorskip("asyncpg")  # web/api/asgi.py uses it where installed
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    token = token_for(viewer)
    params = connection.get_connection_params()

    async def read(name: str) -> StatusRow:
        sql, args = status_body_query(token_key=token_key(token), deployment_id=deployment.pk,
                                      permission=VIEW_PERMISSION, stored=name)
        conn = await asyncpg.connect(host=params.get("host"), port=params.get("port"),
                                     user=params.get("user"), password=params.get("password"),
                                     database=params.get("dbname"))
        try:
            rows = await conn.fetch(sql, *args)
        finally:
            await conn.close()
        [row] = status_rows(rows=rows, fields=(), wrapper=connection, stored=name)
        return row

    expected = _django_answers(token, deployment.pk)
    for name in ("detail", "summary"):
        row = asyncio.run(read(name))
        assert row.stored == expected[name] and row.version == _version(deployment.pk)
    Deployment.objects.filter(pk=deployment.pk).update(name="renamed")
    for name in ("detail", "summary"):
        row = asyncio.run(read(name))
        assert row.stored is None and row.version == _version(deployment.pk)
