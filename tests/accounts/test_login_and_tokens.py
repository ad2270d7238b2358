"""Guessing passwords is throttled per username and address; API tokens are kept only as
hashes, shown once, revoked; plain tokens from before are hashed and keep working."""

from __future__ import annotations

import io
import secrets

import pytest
from django.apps import apps
from django.core.management import call_command
from django.test import Client
from knox.models import AuthToken
from rest_framework.authtoken.models import Token

from web.accounts.tokens import token_create

pytestmark = pytest.mark.django_db

LIMIT = 5  # AXES_FAILURE_LIMIT's default


@pytest.fixture
def someone(django_user_model):  # type: ignore[no-untyped-def]
    # A fresh name each run: the counters live in Redis, past the test's transaction.
    name = f"guess-{secrets.token_hex(4)}"
    return django_user_model.objects.create_user(username=name, password="right-pass-1")


def _login(username: str, password: str, address: str = "127.0.0.1"):  # type: ignore[no-untyped-def]
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username,
                                                        "password": password})


def test_after_the_failure_limit_even_the_right_password_is_refused_with_a_reason(someone) -> None:  # type: ignore[no-untyped-def]
    for _ in range(LIMIT - 1):
        assert _login(someone.username, "wrong").status_code == 200  # the form again
    locked = _login(someone.username, "wrong")
    assert locked.status_code == 429
    right = _login(someone.username, "right-pass-1")
    assert right.status_code == 429 and "Too many failed logins" in right.content.decode()
    assert "0:15:00" in right.content.decode()
    # Another address is its own counter: the owner can still log in from elsewhere.
    assert _login(someone.username, "right-pass-1", "10.9.8.7").status_code == 302


def test_a_success_before_the_limit_clears_the_count(someone) -> None:  # type: ignore[no-untyped-def]
    for _ in range(LIMIT - 1):
        _login(someone.username, "wrong")
    assert _login(someone.username, "right-pass-1").status_code == 302
    for _ in range(LIMIT - 1):
        assert _login(someone.username, "wrong").status_code == 200


def test_a_spoofed_forwarded_for_header_does_not_reset_the_count(someone) -> None:  # type: ignore[no-untyped-def]
    for i in range(LIMIT):
        Client(HTTP_X_FORWARDED_FOR=f"10.0.0.{i}").post(
            "/login/", {"username": someone.username, "password": "wrong"})
    assert _login(someone.username, "right-pass-1").status_code == 429


def test_a_token_is_shown_once_stored_as_a_hash_and_revoked(viewer) -> None:  # type: ignore[no-untyped-def]
    out, err = io.StringIO(), io.StringIO()
    call_command("apitoken", "create", "vera", stdout=out, stderr=err)
    token = out.getvalue().strip()
    assert token.startswith("sda_") and "shown only now" in err.getvalue()
    (row,) = AuthToken.objects.filter(user=viewer)
    assert token not in {row.digest, row.token_key} and len(row.digest) == 128
    api = Client(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get("/api/deployments/").status_code == 200
    listing = io.StringIO()
    call_command("apitoken", "list", stdout=listing)
    assert row.token_key in listing.getvalue() and token not in listing.getvalue()
    call_command("apitoken", "revoke", row.token_key, stdout=io.StringIO())
    assert api.get("/api/deployments/").status_code == 401


def test_a_plain_token_from_before_is_hashed_and_keeps_working(viewer) -> None:  # type: ignore[no-untyped-def]
    migration = __import__("web.accounts.migrations.0001_hash_plain_tokens",
                           fromlist=["hash_plain_tokens"])
    plain = Token.objects.create(user=viewer).key
    migration.hash_plain_tokens(apps, None)
    assert not Token.objects.exists()
    assert not AuthToken.objects.filter(digest=plain).exists()
    assert Client(HTTP_AUTHORIZATION=f"Token {plain}").get("/api/deployments/").status_code == 200


@pytest.mark.parametrize("header", ["Token \xff\xfe\xfd", "Token " + "a" * 5000, "Token a b",
                                    "Token sda_\x00abc", "Token sda_%00", "Token \x7f\x01",
                                    "Token", "Token sda_" + "0" * 64, "Bearer x"])
def test_a_malformed_or_unknown_token_is_a_401(viewer, header: str) -> None:  # type: ignore[no-untyped-def]
    token_create(username="vera")
    assert Client(HTTP_AUTHORIZATION=header).get("/api/deployments/").status_code == 401


@pytest.mark.parametrize("username", ["a\x00b", "x" * 10_000, "\ud7ff\n"])
def test_a_hostile_username_is_a_form_error_not_a_500(username: str) -> None:
    client = Client(raise_request_exception=False)
    assert client.post("/login/", {"username": username, "password": "p"}).status_code == 200
