"""The status reads' token path, the one polling dashboards take (web/api/views.status_read,
web/api/selectors.py): a GET of the detail or the summary with an API token is answered from
one prepared statement, with the viewset's own answer (body, ETag, 304, headers); every other
request, and every refusal, is the viewset's, with its status, body and side effects."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import resolve
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from tests.specs import spec
from web.accounts.models import TokenScope
from web.accounts.tokens import token_create, token_revoke
from web.deploy import services as deploying
from web.deployments.models import Deployment
from web.deployments.permissions import ROLE_PERMISSIONS
from web.deployments.simulator import simulator_images_recent

pytestmark = pytest.mark.django_db
READS = ("", "summary/")
INVALID = {"detail": "Invalid token."}


@pytest.fixture
def deployment() -> Deployment:
    return deploying.deployment_create(data=spec(), confirm_warnings=True)


def _url(deployment: Deployment | int, read: str) -> str:
    return f"/api/deployments/{getattr(deployment, 'pk', deployment)}/{read}"


def _api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _both(url: str, **headers: str) -> tuple[Any, int, Any, int]:
    """The same request through the status read's view and through the viewset's own view
    behind it: (answer, queries) of each, rendered."""
    view = resolve(url)
    answers = []
    simulator_images_recent()  # read once a process every 30 s: not the read's cost
    for func in (view.func, view.func.__wrapped__):
        request = RequestFactory().get(url, **headers)
        with CaptureQueriesContext(connection) as captured:
            answer = func(request, *view.args, **view.kwargs)
            answer.render()
        answers += [answer, len(captured.captured_queries)]
    return answers[0], answers[1], answers[2], answers[3]


@pytest.mark.parametrize("read", READS)
def test_a_token_read_is_the_viewsets_answer_byte_for_byte_from_one_statement(
        deployment: Deployment, viewer: Any, token_for: Any, read: str) -> None:
    auth = f"Token {token_for(viewer)}"
    fast, fast_queries, full, full_queries = _both(_url(deployment, read),
                                                   HTTP_AUTHORIZATION=auth)
    assert (fast_queries, full_queries) == (1, 3)
    assert fast.status_code == full.status_code == 200
    assert fast.content == full.content and dict(fast.headers) == dict(full.headers)
    assert fast["Allow"] and fast["Vary"] == "Accept" and fast["Content-Type"] == "application/json"
    fast, _, full, _ = _both(_url(deployment, read), HTTP_AUTHORIZATION=auth,
                             HTTP_IF_NONE_MATCH=fast["ETag"])
    assert fast.status_code == full.status_code == 304
    assert fast.content == full.content == b"" and dict(fast.headers) == dict(full.headers)


def test_an_expired_token_is_refused_and_deleted_as_before(deployment: Deployment,
                                                            viewer: Any) -> None:
    row, token = token_create(username=viewer.username)
    AuthToken.objects.filter(pk=row.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    for read in READS:
        answer = _api(token).get(_url(deployment, read))
        assert answer.status_code == 401 and answer.json() == INVALID
        assert answer["WWW-Authenticate"] == "Token"
    assert not AuthToken.objects.filter(pk=row.pk).exists()


def test_a_revoked_token_is_refused(deployment: Deployment, viewer: Any) -> None:
    row, token = token_create(username=viewer.username)
    assert _api(token).get(_url(deployment, "")).status_code == 200
    assert token_revoke(key=row.token_key) == 1
    for read in READS:
        answer = _api(token).get(_url(deployment, read))
        assert answer.status_code == 401 and answer.json() == INVALID


def test_a_token_of_the_right_key_with_another_secret_is_refused(
        deployment: Deployment, viewer: Any, token_for: Any) -> None:
    token = token_for(viewer)
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    for read in READS:
        answer = _api(forged).get(_url(deployment, read))
        assert answer.status_code == 401 and answer.json() == INVALID


def test_an_inactive_users_token_is_refused(deployment: Deployment, viewer: Any,
                                            token_for: Any) -> None:
    token = token_for(viewer)
    viewer.is_active = False
    viewer.save(update_fields=["is_active"])
    for read in READS:
        answer = _api(token).get(_url(deployment, read))
        assert answer.status_code == 401
        assert answer.json() == {"detail": "User inactive or deleted."}


def test_a_user_without_the_view_permission_is_forbidden(
        deployment: Deployment, viewer: Any, token_for: Any) -> None:
    token = token_for(viewer)
    viewer.groups.clear()  # the token's viewer scope grants no more than its user holds
    for read in READS:
        answer = _api(token).get(_url(deployment, read))
        assert answer.status_code == 403
        assert answer.json()["detail"].startswith("You need the viewer role")


def test_a_token_scoped_to_a_role_without_the_view_permission_is_forbidden(
        deployment: Deployment, viewer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A role added beside viewer and operator that grants no reading: its token may not
    # read, whatever its user holds.
    monkeypatch.setitem(ROLE_PERMISSIONS, "notifier", frozenset())
    row, token = token_create(username=viewer.username, role="viewer")
    TokenScope.objects.filter(token=row).update(role="notifier")
    for read in READS:
        assert _api(token).get(_url(deployment, read)).status_code == 403


def test_a_permission_held_directly_lets_a_user_read(deployment: Deployment,
                                                     django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="pia", password="pia-pass-1")
    user.user_permissions.add(Permission.objects.get(codename="view_deployment"))
    token = token_create(username=user.username)[1]
    for read in READS:
        assert _api(token).get(_url(deployment, read)).status_code == 200


def test_an_admins_and_an_operators_tokens_read(deployment: Deployment, admin: Any,
                                                operator: Any, token_for: Any) -> None:
    for user in (admin, operator):
        for read in READS:
            answer = _api(token_for(user)).get(_url(deployment, read))
            assert answer.status_code == 200 and answer.json()["name"] == deployment.name


def test_an_unknown_deployment_is_not_found_as_before(viewer: Any, token_for: Any) -> None:
    auth = f"Token {token_for(viewer)}"
    for read in READS:
        answer = _api(auth.split()[1]).get(_url(999_999, read))
        assert answer.status_code == 404
        assert answer.json() == {"detail": "No Deployment matches the given query."}
        for pk in (999_999, "abc", "9" * 30):
            fast, _, full, _ = _both(_url(pk, read), HTTP_AUTHORIZATION=auth)
            assert fast.status_code == full.status_code == 404, (pk, read)
            assert fast.content == full.content and dict(fast.headers) == dict(full.headers)


def test_a_status_filter_and_another_accept_go_the_viewsets_way(
        deployment: Deployment, viewer: Any, token_for: Any) -> None:
    api = _api(token_for(viewer))
    assert api.get(_url(deployment, ""), {"status": "failed"}).status_code == 404
    browsable = api.get(_url(deployment, ""), HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200 and browsable["Content-Type"].startswith("text/html")


def test_a_session_read_answers_the_same_body(deployment: Deployment, viewer: Any,
                                              token_for: Any) -> None:
    session = APIClient()
    session.force_login(viewer)
    for read in READS:
        by_session = session.get(_url(deployment, read))
        by_token = _api(token_for(viewer)).get(_url(deployment, read))
        assert by_session.status_code == by_token.status_code == 200
        assert by_session.content == by_token.content
        assert by_session["ETag"] == by_token["ETag"]


def test_without_a_token_the_read_is_refused(deployment: Deployment) -> None:
    for read in READS:
        assert APIClient().get(_url(deployment, read)).status_code == 401
        malformed = APIClient().get(_url(deployment, read), HTTP_AUTHORIZATION="Token a b")
        assert malformed.status_code == 401


def test_the_statement_is_prepared_on_the_connection_that_runs_it(
        deployment: Deployment, viewer: Any, token_for: Any) -> None:
    api = _api(token_for(viewer))
    for _ in range(8):  # past psycopg's prepare_threshold (settings: 5)
        assert api.get(_url(deployment, "")).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements "
                       "WHERE statement LIKE %s", ['%"token_key"%'])
        assert cursor.fetchone()[0] >= 1
