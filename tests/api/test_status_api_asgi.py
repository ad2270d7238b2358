"""The status reads' token GETs answered before Django (web/api/asgi.py), through the real
uvicorn app: a panel as shipped beside one with APPLIANCE_STATUS_READS_BEFORE_DJANGO=0
(every request Django's), the same requests to both; status, headers (all but Date) and
body bytes must be the same, for the answers given early (200, 304) and for every refusal,
which stays Django's."""

from __future__ import annotations

import asyncio
import http.client
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connection, connections
from django.utils import timezone
from knox.models import AuthToken

from appliance.runtime import series
from appliance.runtime.alerts import Alert
from tests.servers import panel_server
from tests.specs import spec
from web.accounts.tokens import token_create, token_revoke
from web.api.asgi import StatusReads
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, StatusBody
from web.deployments.selectors import deployment_list
from web.deployments.services.metrics import deployment_apply_alerts, metrics_store_point
from web.serving import django_application

pytestmark = pytest.mark.django_db(transaction=True)
READS = ("", "summary/")
Answer = tuple[int, list[tuple[str, str]], bytes]


@pytest.fixture(scope="module")
def panels(django_db_setup: Any, django_db_blocker: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the panel as shipped, the panel with every request Django's)."""
    logs = tmp_path_factory.mktemp("panels")
    with django_db_blocker.unblock(), \
            panel_server(Path(logs / "fast.log")) as fast, \
            panel_server(Path(logs / "django.log"),
                         APPLIANCE_STATUS_READS_BEFORE_DJANGO="0") as django:
        yield fast, django


@pytest.fixture
def deployment() -> Deployment:
    return deploying.deployment_create(data=spec(), confirm_warnings=True)


def _get(base: str, path: str, **headers: str) -> Answer:
    """(status, headers in order without Date, body) as they came over the wire."""
    where = urlsplit(base)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        return (answer.status, [(k, v) for k, v in answer.getheaders() if k.lower() != "date"],
                answer.read())
    finally:
        conn.close()


def _url(deployment: Deployment | int | str, read: str) -> str:
    return f"/api/deployments/{getattr(deployment, 'pk', deployment)}/{read}"


def _early_reader_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database()", ["status-reads"])
        return int(cursor.fetchone()[0])


def test_a_token_read_is_djangos_answer_header_for_header_and_byte_for_byte(
        panels: tuple[str, str], deployment: Deployment, viewer: Any, token_for: Any) -> None:
    fast, django = panels
    auth = {"Authorization": f"Token {token_for(viewer)}"}
    for read in READS:
        expected = _get(django, _url(deployment, read), **auth)
        names = {k.lower(): v for k, v in expected[1]}
        assert expected[0] == 200 and names["etag"]
        assert {"x-content-type-options", "referrer-policy", "cross-origin-opener-policy",
                "x-frame-options", "allow", "vary", "cache-control", "content-type",
                "content-length"} <= names.keys()
        # The first is Django's (its headers are learnt from it), the rest are early.
        for _ in range(3):
            assert _get(fast, _url(deployment, read), **auth) == expected
            assert _get(fast, _url(deployment, read), Accept="application/json",
                        **auth) == _get(django, _url(deployment, read),
                                        Accept="application/json", **auth)
        etag = names["etag"]
        unchanged = _get(django, _url(deployment, read), **{"If-None-Match": etag}, **auth)
        assert unchanged[0] == 304 and unchanged[2] == b""
        for _ in range(3):
            assert _get(fast, _url(deployment, read), **{"If-None-Match": etag},
                        **auth) == unchanged
            stale = _get(fast, _url(deployment, read), **{"If-None-Match": '"other"'}, **auth)
            assert stale == expected
    assert _early_reader_sessions() >= 1  # the early path did answer
    Deployment.objects.filter(pk=deployment.pk).update(name="renamed")
    for read in READS:
        changed = _get(fast, _url(deployment, read), **auth)
        assert changed == _get(django, _url(deployment, read), **auth)
        assert changed[0] == 200 and b'"renamed"' in changed[2]


def _stored_is_current(deployment: Deployment) -> bool:
    """Whether the writers' stored answers (StatusBody) are of the row's current version,
    so the early path answers with them, decoding nothing."""
    current = deployment_list(versioned=True).get(pk=deployment.pk).row_version
    return StatusBody.objects.filter(pk=deployment.pk, version=current).exists()


def test_the_answers_the_writers_stored_are_djangos_header_for_header_and_byte_for_byte(
        panels: tuple[str, str], deployment: Deployment, viewer: Any, token_for: Any) -> None:
    fast, django = panels
    auth = {"Authorization": f"Token {token_for(viewer)}"}
    point = series.MetricPoint(t=1_790_000_000.0, throughput=1234.5, accept_len=4.2,
                               gpus=[[90.0, 70.0, 80.0]])
    writes = [
        lambda: metrics_store_point(deployment_id=deployment.pk, point=point, resolution_s=2),
        lambda: deployment_apply_alerts(deployment_id=deployment.pk, alerts=[
            Alert("stall", "firing", "warning", "no progress")]),
        lambda: services.events_append(deployment_id=deployment.pk, events=[
            ("log", {"text": "Decode batch. #running-req: 8"})]),
        lambda: services.deployment_mark_building(deployment_id=deployment.pk),
    ]
    for write in writes:
        write()
        assert _stored_is_current(deployment)
        for read in READS:
            expected = _get(django, _url(deployment, read), **auth)
            assert expected[0] == 200
            for _ in range(2):  # the first may be Django's (learning its headers)
                assert _get(fast, _url(deployment, read), **auth) == expected
            etag = {k.lower(): v for k, v in expected[1]}["etag"]
            assert _get(fast, _url(deployment, read), **{"If-None-Match": etag}, **auth) == \
                _get(django, _url(deployment, read), **{"If-None-Match": etag}, **auth)
    assert b'"throughput":1234.5' in expected[2] and b'"building"' in expected[2]
    # A write that stores nothing: the early path renders the row, as Django does.
    Deployment.objects.filter(pk=deployment.pk).update(phase="written elsewhere")
    assert not _stored_is_current(deployment)
    for read in READS:
        changed = _get(fast, _url(deployment, read), **auth)
        assert changed == _get(django, _url(deployment, read), **auth)
        assert b'"written elsewhere"' in changed[2]


def _same_everywhere(panels: tuple[str, str], path: str, **headers: str) -> Answer:
    fast, django = panels
    answer = _get(fast, path, **headers)
    assert answer == _get(django, path, **headers), path
    return answer


def test_an_expired_token_is_djangos_refusal_and_is_deleted(
        panels: tuple[str, str], deployment: Deployment, viewer: Any) -> None:
    answers = []
    for panel in panels:
        row, token = token_create(username=viewer.username)
        AuthToken.objects.filter(pk=row.pk).update(expiry=timezone.now() - timedelta(seconds=1))
        answers.append(_get(panel, _url(deployment, ""), Authorization=f"Token {token}"))
        assert not AuthToken.objects.filter(pk=row.pk).exists()
    assert answers[0] == answers[1] and answers[0][0] == 401


def test_a_revoked_a_forged_and_a_missing_token_are_djangos_refusals(
        panels: tuple[str, str], deployment: Deployment, viewer: Any) -> None:
    row, token = token_create(username=viewer.username)
    assert _same_everywhere(panels, _url(deployment, ""), Authorization=f"Token {token}")[0] == 200
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    assert token_revoke(key=row.token_key) == 1
    for read in READS:
        for auth in (f"Token {token}", f"Token {forged}", "Token a b", "Bearer x"):
            answer = _same_everywhere(panels, _url(deployment, read), Authorization=auth)
            assert answer[0] == 401
        assert _same_everywhere(panels, _url(deployment, read))[0] == 401


def test_an_inactive_user_and_a_user_without_the_permission_get_djangos_refusals(
        panels: tuple[str, str], deployment: Deployment, viewer: Any, operator: Any,
        token_for: Any) -> None:
    inactive, unpermitted = token_for(viewer), token_for(operator)
    for read in READS:  # both read first, so the early path has learnt these answers
        for token in (inactive, unpermitted):
            assert _same_everywhere(panels, _url(deployment, read),
                                    Authorization=f"Token {token}")[0] == 200
    viewer.is_active = False
    viewer.save(update_fields=["is_active"])
    operator.groups.clear()
    for read in READS:
        assert _same_everywhere(panels, _url(deployment, read),
                                Authorization=f"Token {inactive}")[0] == 401
        assert _same_everywhere(panels, _url(deployment, read),
                                Authorization=f"Token {unpermitted}")[0] == 403


def test_an_unknown_deployment_and_other_requests_are_djangos_answers(
        panels: tuple[str, str], deployment: Deployment, viewer: Any, token_for: Any) -> None:
    auth = f"Token {token_for(viewer)}"
    for read in READS:
        assert _same_everywhere(panels, _url(deployment, read), Authorization=auth)[0] == 200
        for pk in (999_999, "abc", "9" * 30, "01"):
            _same_everywhere(panels, _url(pk, read), Authorization=auth)
        assert _same_everywhere(panels, _url(999_999, read), Authorization=auth)[0] == 404
        assert _same_everywhere(panels, _url(deployment, read) + "?status=failed",
                                Authorization=auth)[0] == 404
        # The browsable API's page (its CSRF token differs each time): Django's on both.
        pages = [_get(panel, _url(deployment, read), Authorization=auth, Accept="text/html")
                 for panel in panels]
        assert [(p[0], dict(p[1])["content-type"]) for p in pages] == [
            (200, "text/html; charset=utf-8")] * 2
        assert _same_everywhere(panels, _url(deployment, read), Authorization=auth,
                                Host="evil.example")[0] == 400


def test_once_an_answer_is_learnt_django_is_not_asked_again(
        deployment: Deployment, viewer: Any, token_for: Any) -> None:
    django_app, asked = django_application(), []

    async def django(scope: Any, receive: Any, send: Any) -> None:
        asked.append(scope["path"])
        await django_app(scope, receive, send)

    app = StatusReads(django)
    auth = (b"authorization", f"Token {token_for(viewer)}".encode())

    async def get(path: str, *headers: tuple[bytes, bytes]) -> tuple[int, bytes, bytes]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "query_string": b"",
                 "root_path": "", "scheme": "http", "http_version": "1.1",
                 "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
                 "headers": [(b"host", b"127.0.0.1"), auth, *headers]}
        await app(scope, receive, send)
        head = dict(sent[0]["headers"])
        return sent[0]["status"], head[b"etag"], b"".join(m.get("body", b"") for m in sent[1:])

    async def reads() -> None:
        try:
            for read in READS:
                path = _url(deployment, read)
                first = await get(path)
                assert first[0] == 200 and all([await get(path) == first for _ in range(5)])
                unchanged = await get(path, (b"if-none-match", first[1]))
                assert unchanged == (304, first[1], b"")
                for _ in range(5):
                    assert await get(path, (b"if-none-match", first[1])) == unchanged
                assert asked == [_url(deployment, r) for r in READS[:READS.index(read) + 1]
                                 for _ in range(2)]
        finally:
            await app.close()

    asyncio.run(reads())


def test_an_asyncpg_pool_that_could_not_open_is_opened_by_a_later_read(
        deployment: Deployment, viewer: Any, token_for: Any) -> None:
    pytest.importorskip("asyncpg")  # its pool serves the stored bodies where installed
    django_app, asked = django_application(), []

    async def django(scope: Any, receive: Any, send: Any) -> None:
        asked.append(scope["path"])
        await django_app(scope, receive, send)

    app = StatusReads(django)
    app.wrapper = connections.create_connection("default")
    port = app.wrapper.settings_dict["PORT"]
    with socket.socket() as closed:  # a port nothing listens on: the database "down"
        closed.bind(("127.0.0.1", 0))
        app.wrapper.settings_dict["PORT"] = closed.getsockname()[1]
    scope = {"type": "http", "method": "GET", "path": _url(deployment, ""), "query_string": b"",
             "root_path": "", "scheme": "http", "http_version": "1.1",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"127.0.0.1"),
                         (b"authorization", f"Token {token_for(viewer)}".encode())]}

    async def get() -> int:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return int(sent[0]["status"])

    async def reads() -> None:
        try:
            assert await get() == 200 and len(asked) == 1  # could not connect: Django's
            app.wrapper.settings_dict["PORT"] = port  # the database is back
            assert await get() == 200 and len(asked) == 2  # opened; Django's headers learnt
            assert [await get() for _ in range(3)] == [200] * 3 and len(asked) == 2
        finally:
            await app.close()

    asyncio.run(reads())
