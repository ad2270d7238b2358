"""The navigation's "API tokens" and "API keys" say which is for what: tokens for the panel's
REST API, keys for the gateway's OpenAI-compatible /v1; the tokens page names the keys page
for calling a model."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


def _page(user, name: str) -> str:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    response = client.get(reverse(name))
    assert response.status_code == 200
    return response.content.decode()


def _nav_link(page: str, link_id: str) -> str:
    found = re.search(rf'<a [^>]*id="{link_id}"[^>]*>[^<]*</a>', page)
    assert found, link_id
    return found.group(0)


@pytest.mark.parametrize("page_name", ["accounts:tokens", "gateway:keys"])
def test_the_navigation_says_what_tokens_and_keys_are_for_on_every_page(
        operator, page_name: str) -> None:  # type: ignore[no-untyped-def]
    page = _page(operator, page_name)
    tokens, keys = _nav_link(page, "nav-tokens"), _nav_link(page, "nav-keys")
    assert ">API tokens (REST)</a>" in tokens and "REST API (/api/)" in tokens
    assert ">API keys (gateway)</a>" in keys and "OpenAI-compatible /v1" in keys


def test_the_tokens_page_sends_a_person_calling_a_model_to_the_keys_page(viewer) -> None:  # type: ignore[no-untyped-def]
    page = _page(viewer, "accounts:tokens")
    note = page.split('id="tokens-or-keys">', 1)[1].split("</p>", 1)[0]
    assert "REST API" in note and "<code>/v1</code>" in note
    assert f'href="{reverse("gateway:keys")}">API key</a>' in note
