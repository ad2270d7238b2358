"""The detail page's "How to call it": the gateway's base URL and the served model name, a curl
and a Python `openai` example with the key elided, and which of the reader's own keys may
call the deployment (or a link to make one). Before ready, a line saying it will be callable."""

from __future__ import annotations

import json
import shlex
from html.parser import HTMLParser

import pytest
from django.test import Client
from django.urls import reverse

from tests.rows import queued, ready
from web.deployments.models import Deployment
from web.gateway.services import apikey_create, apikey_revoke

pytestmark = pytest.mark.django_db


class _Elements(HTMLParser):
    """Each element with an id: its attributes and its text (nested text included)."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, dict[str, str]] = {}
        self.text: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []

    VOID = {"br", "img", "input", "meta", "link", "hr", "source"}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.attrs[a["id"]] = a
            self.text[a["id"]] = ""
        if tag not in self.VOID:
            self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, element_id in self._open:
            if element_id:
                self.text[element_id] += data


def _page(user, deployment: Deployment) -> _Elements:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    response = client.get(f"/deployments/{deployment.pk}/")
    assert response.status_code == 200
    parsed = _Elements()
    parsed.feed(response.content.decode())
    return parsed


def test_a_ready_deployment_says_its_base_url_model_and_how_to_call_it_with_the_key_elided(operator):  # type: ignore[no-untyped-def]
    page = _page(operator, ready())
    assert "hidden" not in page.attrs["call-ready"]
    assert "hidden" in page.attrs["call-not-ready"]
    assert page.text["call-base-url"] == "http://testserver/v1"
    assert page.text["call-model"] == "kimi-ddtree"  # the deployment's name by default
    curl = page.text["call-curl"]
    assert "$SD_API_KEY" in curl and "sk-sd-" not in curl
    # The curl pastes into a shell as it is: its URL and its JSON body survive the quoting.
    words = shlex.split(curl.replace("\\\n", " "))
    assert words[:3] == ["curl", "-N", "http://testserver/v1/chat/completions"]
    assert "Authorization: Bearer $SD_API_KEY" in words
    body = json.loads(words[words.index("-d") + 1])
    assert body["model"] == "kimi-ddtree" and body["stream"] is True
    python = page.text["call-python"]
    compile(python, "example.py", "exec")  # it is Python as shown
    assert 'base_url="http://testserver/v1"' in python
    assert 'os.environ["SD_API_KEY"]' in python and 'model="kimi-ddtree"' in python
    assert "stream=True" in python


def test_the_examples_name_the_served_model_name_the_spec_gives(operator):  # type: ignore[no-untyped-def]
    page = _page(operator, ready(engine__served_model_name="kimi-k2.6"))
    assert page.text["call-model"] == "kimi-k2.6"
    assert 'model="kimi-k2.6"' in page.text["call-python"]
    assert '"model": "kimi-k2.6"' in page.text["call-curl"]


def test_a_deployment_not_yet_ready_says_it_will_be_callable_onceready(operator):  # type: ignore[no-untyped-def]
    page = _page(operator, queued())
    assert "hidden" not in page.attrs["call-not-ready"]
    assert "callable" in page.text["call-not-ready"] and "once it is ready" in page.text["call-not-ready"]
    # The examples are on the page, hidden: howto.js shows them when the live status is ready.
    assert "hidden" in page.attrs["call-ready"]
    assert page.attrs["how-to-call"]["data-ready"] == "0"


def test_it_names_each_of_the_readers_keys_that_may_call_it_by_name_and_prefix(operator):  # type: ignore[no-untyped-def]
    deployment = ready()
    everywhere = apikey_create(owner_username=operator.username, name="laptop")
    scoped = apikey_create(owner_username=operator.username, name="ci",
                           deployment_ids=[deployment.pk])
    page = _page(operator, deployment)
    keys = page.text["call-keys"]
    for new in (everywhere, scoped):
        prefix = "sk-sd-" + new.key.prefix
        assert f"Your key '{new.key.name}' ({prefix}…) may call it." in keys
        assert new.secret not in keys
    assert "make-key" not in page.attrs


def test_it_says_none_of_the_readers_keys_may_call_it_and_links_to_the_keys_page(operator, admin):  # type: ignore[no-untyped-def]
    deployment = ready()
    other = queued(name="other", gpus=[1])
    apikey_create(owner_username=operator.username, name="elsewhere", deployment_ids=[other.pk])
    revoked = apikey_create(owner_username=operator.username, name="old")
    assert apikey_revoke(prefix=revoked.key.prefix)
    apikey_create(owner_username=admin.username, name="admins-own")  # not the reader's
    page = _page(operator, deployment)
    assert page.text["call-keys"].startswith("None of your keys may call it: make one")
    assert page.attrs["make-key"]["href"] == reverse("gateway:keys")
    for name in ("elsewhere", "old", "admins-own"):
        assert name not in page.text["call-keys"]


def test_the_page_never_shows_a_keys_secret(operator):  # type: ignore[no-untyped-def]
    deployment = ready()
    new = apikey_create(owner_username=operator.username, name="laptop")
    client = Client()
    client.force_login(operator)
    assert new.secret.encode() not in client.get(f"/deployments/{deployment.pk}/").content


def test_an_operator_gets_a_link_to_the_playground_and_a_viewer_none(operator, viewer):  # type: ignore[no-untyped-def]
    deployment = ready()
    assert _page(operator, deployment).attrs["open-playground"]["href"] == \
        f"/deployments/{deployment.pk}/playground/"
    seen_by_viewer = _page(viewer, deployment)
    assert "open-playground" not in seen_by_viewer.attrs
    # A viewer holds no key (keys are for operators): it is told whom to ask, not "make one".
    assert "ask one for a key" in seen_by_viewer.text["call-keys"]
    assert "make-key" not in seen_by_viewer.attrs
