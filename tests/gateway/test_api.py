"""REST API for keys: create (the secret in the 201 only), list, detail with usage, revoke."""

from __future__ import annotations

import pytest

from web.gateway.models import ApiKey

pytestmark = pytest.mark.django_db


def test_an_operator_makes_lists_and_revokes_a_key(client, operator, token_for) -> None:  # type: ignore[no-untyped-def]
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(operator)}"}
    made = client.post("/api/keys/", {"name": "ci", "rate_limit_per_minute": 10},
                       content_type="application/json", **auth)
    assert made.status_code == 201
    body = made.json()
    assert body["secret"].startswith(body["prefix"]) and body["all_deployments"] is True
    listed = client.get("/api/keys/", **auth).json()
    assert [k["name"] for k in listed] == ["ci"] and "secret" not in listed[0]
    assert "digest" not in str(listed)
    detail = client.get(f"/api/keys/{body['id']}/", **auth).json()
    assert detail["usage"] == [] and detail["rate_limit_per_minute"] == 10
    revoked = client.post(f"/api/keys/{body['id']}/revoke/", **auth)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]


def test_bad_input_names_the_field(client, operator, token_for) -> None:  # type: ignore[no-untyped-def]
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(operator)}"}
    for body, field in [({"name": ""}, "name"), ({"name": "k", "deployments": [424242]},
                                                 "deployments"),
                        ({"name": "k", "rate_limit_per_minute": -1}, "rate_limit_per_minute")]:
        answer = client.post("/api/keys/", body, content_type="application/json", **auth)
        assert answer.status_code == 400 and field in answer.json(), body
    assert not ApiKey.objects.exists()


def test_a_viewer_is_refused(client, viewer, token_for) -> None:  # type: ignore[no-untyped-def]
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(viewer)}"}
    assert client.get("/api/keys/", **auth).status_code == 403
    assert client.post("/api/keys/", {"name": "k"}, content_type="application/json",
                       **auth).status_code == 403


def test_one_sees_only_ones_own_keys(client, operator, admin, token_for) -> None:  # type: ignore[no-untyped-def]
    mine = client.post("/api/keys/", {"name": "admins"}, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Token {token_for(admin)}").json()
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(operator)}"}
    assert client.get("/api/keys/", **auth).json() == []
    assert client.get(f"/api/keys/{mine['id']}/", **auth).status_code == 404
    assert client.post(f"/api/keys/{mine['id']}/revoke/", **auth).status_code == 404
