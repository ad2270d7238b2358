"""The playground page (playground_views.py): an operator's chat with a deployment through the
gateway's own URL with the panel session; what the page hands its script, and who may open it.
The chat itself runs in a real browser: tests/e2e/test_playground.py."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.rows import queued, ready

pytestmark = pytest.mark.django_db


def _client(user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(user)
    return client


def _script_data(html: str) -> dict[str, str]:
    tag = re.search(r'<script src="[^"]*playground\.js"([^>]*)>', html)
    assert tag, "the page loads playground.js"
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag.group(1)))


def test_an_operator_opens_the_playground_of_a_ready_deployment(operator):  # type: ignore[no-untyped-def]
    deployment = ready(engine__served_model_name="kimi-k2.6")
    response = _client(operator).get(f"/deployments/{deployment.pk}/playground/")
    assert response.status_code == 200
    html = response.content.decode()
    data = _script_data(html)
    # The script talks to the gateway as any client would, by the served model name, with
    # the session's CSRF token; after each answer it reads the deployment's decode stats.
    assert data["base-url"] == "http://testserver/v1"
    assert data["model"] == "kimi-k2.6"
    assert data["summary"] == f"/api/deployments/{deployment.pk}/summary/"
    assert data["speculative"] == "1"
    assert data["key-var"] == "SD_API_KEY"
    assert len(data["csrf"]) >= 32
    for field in ("pg-system", "pg-temperature", "pg-max-tokens", "pg-message", "pg-send"):
        assert f'id="{field}"' in html
    assert 'id="pg-not-ready"' not in html
    # No build step, nothing from another origin.
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_a_deployment_without_speculation_says_so_to_the_script(operator):  # type: ignore[no-untyped-def]
    deployment = ready(recipe="kimi-k2.6-baseline", engine={
        "model_path": "/models/Kimi-K2.6", "tp_size": 1, "trust_remote_code": True})
    assert deployment.algorithm == "NONE"
    html = _client(operator).get(f"/deployments/{deployment.pk}/playground/").content.decode()
    assert _script_data(html)["speculative"] == "0"


def test_the_playground_of_a_deployment_not_ready_warns_that_the_gateway_answers_503(operator):  # type: ignore[no-untyped-def]
    deployment = queued()
    response = _client(operator).get(f"/deployments/{deployment.pk}/playground/")
    assert response.status_code == 200
    assert b'id="pg-not-ready"' in response.content
    assert b"kimi-ddtree is queued, not ready: the gateway answers 503" in response.content


def test_a_viewer_is_refused_the_playground(viewer):  # type: ignore[no-untyped-def]
    deployment = ready()
    response = _client(viewer).get(f"/deployments/{deployment.pk}/playground/")
    assert response.status_code == 403
    assert b"kimi" not in response.content  # nothing of the deployment is shown


def test_the_playground_asks_a_stranger_to_log_in(client):  # type: ignore[no-untyped-def]
    deployment = ready()
    response = client.get(f"/deployments/{deployment.pk}/playground/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_playground_of_an_unknown_deployment_is_404(operator):  # type: ignore[no-untyped-def]
    assert _client(operator).get("/deployments/999999/playground/").status_code == 404


def test_the_playground_page_takes_no_post(operator):  # type: ignore[no-untyped-def]
    deployment = ready()
    client = Client(enforce_csrf_checks=False)
    client.force_login(operator)
    assert client.post(f"/deployments/{deployment.pk}/playground/").status_code == 405
