"""API tokens scoped to a role: made in the panel (shown once), listed, revoked there; a
request with a token may do what the token's role allows and never more than its user."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from knox.models import AuthToken

from tests.specs import spec
from web.accounts.tokens import TokenRoleError, token_create

pytestmark = pytest.mark.django_db


def _api(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Token {token}")


def _deploy(token: str) -> int:
    return _api(token).post("/api/deployments/", {"spec": spec(), "confirm_warnings": True},
                            content_type="application/json").status_code


def test_an_operators_viewer_token_reads_but_cannot_deploy(operator) -> None:  # type: ignore[no-untyped-def]
    _, token = token_create(username=operator.username, role="viewer")
    assert _api(token).get("/api/deployments/").status_code == 200
    assert _deploy(token) == 403
    _, full = token_create(username=operator.username, role="operator")
    assert _deploy(full) == 201


def test_a_token_is_never_more_than_its_user(viewer, django_user_model) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TokenRoleError, match="viewer"):
        token_create(username=viewer.username, role="operator")
    nobody = django_user_model.objects.create_user(username="nemo", password="nobody-pass-1")
    with pytest.raises(TokenRoleError, match="none"):
        token_create(username=nobody.username)
    _, token = token_create(username=viewer.username)
    assert _deploy(token) == 403
    # A role taken from the user later is gone from the token too.
    viewer.groups.clear()
    assert _api(token).get("/api/deployments/").status_code == 403


def test_an_admins_token_is_scoped_to_operator_at_most(admin) -> None:  # type: ignore[no-untyped-def]
    row, _ = token_create(username=admin.username)
    assert row.scope.role == "operator"


def _panel(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def test_the_panel_makes_a_token_shows_it_once_and_revokes_it(viewer) -> None:  # type: ignore[no-untyped-def]
    panel = _panel(viewer)
    page = panel.get("/account/tokens/").content.decode()
    assert 'value="viewer"' in page and 'value="operator"' not in page
    made = panel.post("/account/tokens/", {"role": "viewer", "days": "30"})
    token = re.search(r'<code class="token">([^<]+)</code>', made.content.decode())[1]  # type: ignore[index]
    assert _api(token).get("/api/deployments/").status_code == 200
    again = panel.get("/account/tokens/").content.decode()
    assert token not in again and "viewer" in again, "listed by key, shown only once"
    (row,) = AuthToken.objects.filter(user=viewer)
    assert token not in (row.digest, row.token_key) and row.scope.role == "viewer"
    panel.post(f"/account/tokens/{row.token_key}/revoke/")
    assert _api(token).get("/api/deployments/").status_code == 401
    assert not AuthToken.objects.filter(user=viewer).exists()


def test_the_panel_refuses_a_role_above_the_users_and_anothers_token(viewer, operator) -> None:  # type: ignore[no-untyped-def]
    refused = _panel(viewer).post("/account/tokens/", {"role": "operator"})
    assert refused.status_code == 400 and not AuthToken.objects.filter(user=viewer).exists()
    row, token = token_create(username=operator.username)
    _panel(viewer).post(f"/account/tokens/{row.token_key}/revoke/")
    assert _api(token).get("/api/deployments/").status_code == 200, "not the viewer's to revoke"


def test_without_a_role_the_page_lists_and_revokes_but_makes_nothing(viewer) -> None:  # type: ignore[no-untyped-def]
    row, _ = token_create(username=viewer.username)
    viewer.groups.clear()
    page = _panel(viewer).get("/account/tokens/").content.decode()
    assert row.token_key in page and "token-form" not in page
    assert _panel(viewer).post("/account/tokens/", {"role": "viewer"}).status_code == 403
    _panel(viewer).post(f"/account/tokens/{row.token_key}/revoke/")
    assert not AuthToken.objects.filter(user=viewer).exists()
