"""Every URL in the URLconf, every method, as an anonymous visitor, a user with no role, a
viewer, an operator and an admin: never a 5xx, and each answer is one the role allows."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services

# transaction=True: the SSE view hands its connection back (closes it) as in production.
pytestmark = pytest.mark.django_db(transaction=True)

METHODS = ("get", "head", "options", "post", "put", "patch", "delete")
ACTORS = ("anonymous", "nobody", "viewer", "operator", "admin")
# Answered to anyone: the login pages, the health check, the icon.
PUBLIC = {"login/", "logout/", "healthz", "admin/login/", "favicon.ico"}
# The Prometheus scrape endpoint is for the monitoring system, not for people.
SCRAPE = {"metrics"}


def _patterns(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[str]:
    for pattern in patterns:
        text = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _patterns(pattern.url_patterns, text)
        else:
            yield text


def _concrete(pattern: str, values: dict[str, str]) -> str:
    """A path for a pattern: each parameter filled with a real object's id or a sample."""
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: values.get(m[1], "x"), pattern)
    path = path.replace("<drf_format_suffix:format>", ".json")
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values.get(m[1], "1"), path)
    path = path.replace("^", "").replace("$", "").replace("\\.", ".").replace("/?", "/")
    return "/" + path.replace("//", "/")


def _paths(pk: int, user_id: int) -> list[str]:
    values = {"pk": str(pk), "object_id": str(user_id), "id": str(user_id), "format": "json",
              "content_type_id": str(ContentType.objects.get_for_model(User).pk),
              "app_label": "auth", "url": "no-such-page/"}
    return sorted({_concrete(p, values) for p in _patterns(get_resolver().url_patterns)})


def _kind(path: str) -> str:
    bare = path.lstrip("/")
    if bare in PUBLIC or bare in SCRAPE:
        return "public"
    if bare.startswith("admin/"):
        return "admin"
    if bare.startswith(("api/schema", "api/docs")) or bare == "api/":
        return "schema"  # any logged-in user: names endpoints and fields, no deployment
    if bare.startswith("api/preflight"):
        return "preflight"
    if bare.startswith("account/"):
        return "account"  # one's own API tokens: any role, never someone else's
    if bare.startswith(("api/fleet/join", "api/fleet/host/")):
        return "host"  # a GPU host's agent: its join token or credential, never a session
    if bare.startswith(("api/fleet/tokens", "fleet/tokens")):
        return "fleet-admin"  # join tokens are an admin's
    if bare.startswith(("api/fleet/hosts", "fleet/")):
        return "fleet"  # viewers read; draining and removing a host is an admin's
    if bare.startswith(("keys/", "api/keys")):
        return "keys"
    if bare.startswith(("api/tunes", "benchmarks/tunes")) or (
            bare.startswith("api/deployments/") and bare.endswith("/tune/")):
        return "tune"  # Tune takes a deployment out of service: an operator's and an admin's  # gateway API keys call deployments: an operator's and an admin's
    if bare.startswith(("api/deployments", "deployments/")) or bare in ("", "api/", "api.json"):
        return "deployments"
    return "other"


def _allowed(actor: str, kind: str, method: str, path: str) -> set[int]:
    read = method in ("get", "head", "options")
    if path.lstrip("/") in SCRAPE:
        return {200, 401, 403, 405}
    if kind == "public":
        return {200, 302, 405}
    if kind == "host":
        return {400, 401, 403, 405}
    if actor == "anonymous":
        return {302, 401, 403, 405}
    if kind == "admin":
        return {200, 302, 403, 404, 405} if actor == "admin" else {302, 403, 405}
    if kind == "schema":
        return {200, 405}
    if kind == "preflight":
        return {200, 400, 405}
    if kind == "account":
        return {200, 405} if read else {200, 302, 400, 403, 405}
    if actor == "nobody":
        return {403, 405}
    if actor == "viewer" and kind in ("keys", "tune"):
        return {403, 405}
    if actor != "admin" and (kind == "fleet-admin" or (kind == "fleet" and (
            not read or path.endswith("/remove/")))):  # Remove's confirm page too
        return {403, 405}
    if actor == "viewer":
        # The new form, the Stop, Delete and Rolling restart confirm pages and the playground
        # (it calls the gateway, which takes an operator) are an operator's.
        action_page = "/new/" in path or (path.startswith("/deployments/") and path.endswith(
            ("/stop/", "/delete/", "/restart/", "/playground/")))
        return {200, 404, 405} if read and not action_page else {403, 405}
    if read:
        return {200, 404, 405}
    return {200, 201, 202, 204, 302, 400, 403, 404, 405}


def _client(user: User | None) -> Client:
    # 500s are counted, not raised: the walk reports every one at once.
    client = Client(raise_request_exception=False)
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def people(django_user_model, viewer, operator, admin):  # type: ignore[no-untyped-def]
    nobody = django_user_model.objects.create_user(username="nemo", password="nobody-pass-1")
    return {"anonymous": None, "nobody": nobody, "viewer": viewer, "operator": operator,
            "admin": admin}


def test_every_url_every_method_every_role(people) -> None:  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    services.deployment_stop(deployment_id=deployment.pk)  # its stream ends at once
    paths = _paths(deployment.pk, people["viewer"].pk)
    assert len(paths) > 40 and "/api/deployments/" in paths
    wrong: list[str] = []
    sent = 0
    for actor in ACTORS:
        session = _client(people[actor])
        for path in paths:
            for method in METHODS:
                # Logging out ends the session: that one gets a client of its own.
                client = _client(people[actor]) if "logout" in path else session
                body = {} if method in ("post", "put", "patch") else None
                kwargs = {"data": body, "content_type": "application/json"} if body is not None \
                    else {}
                status = getattr(client, method)(path, **kwargs).status_code
                sent += 1
                if status >= 500 or status not in _allowed(actor, _kind(path), method, path):
                    wrong.append(f"{actor} {method.upper()} {path} -> {status}")
    errors = sum(" -> 5" in w for w in wrong)
    print(f"\nurl-walk: requests {sent}, 5xx {errors}, wrongly answered {len(wrong) - errors}")
    assert not wrong, "\n".join(wrong)
