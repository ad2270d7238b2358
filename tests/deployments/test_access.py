"""Who reads what: an anonymous visitor and a logged-in user with no role read no
deployment and no API schema; a viewer reads; only an operator deploys and stops."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment

# transaction=True: the SSE view hands its connection back (closes it) as in production.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def nobody(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user(username="nemo", password="nobody-pass-1")


def _client(user=None) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _reads(pk: int) -> list[str]:
    return ["/", f"/deployments/{pk}/", f"/deployments/{pk}/events/stream/",
            "/api/deployments/", f"/api/deployments/{pk}/", f"/api/deployments/{pk}/events/",
            f"/api/deployments/{pk}/summary/"]


def test_a_logged_in_user_with_no_role_reads_no_deployment(nobody) -> None:  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    client = _client(nobody)
    for path in _reads(pk):
        response = client.get(path)
        assert response.status_code == 403, path
        assert "kimi" not in response.content.decode(errors="replace").lower(), path


def test_a_viewer_reads_every_deployment_page_but_cannot_deploy_or_stop(viewer) -> None:  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    client = _client(viewer)
    for path in _reads(pk):
        if path.endswith("/stream/"):
            continue  # a stream that never ends; tests/deployments/test_sse.py covers it live
        assert client.get(path).status_code == 200, path
    assert client.post("/api/deployments/", spec(name="x"),
                       content_type="application/json").status_code == 403
    assert client.post(f"/api/deployments/{pk}/stop/").status_code == 403


def test_the_api_schema_and_docs_need_a_login(viewer) -> None:  # type: ignore[no-untyped-def]
    anonymous = _client()
    for path in ("/api/schema/", "/api/docs/"):
        assert anonymous.get(path).status_code in {401, 403}, path
        assert _client(viewer).get(path).status_code == 200, path


@pytest.mark.parametrize(("field", "where"), [
    ("model_path", "engine.model_path"), ("speculative_draft_model_path",
                                          "engine.speculative_draft_model_path")])
def test_a_nul_byte_is_a_field_error_not_a_500_and_nothing_is_stored(
        operator, field: str, where: str) -> None:  # type: ignore[no-untyped-def]
    data = spec(name="nul")
    data["engine"][field] = "/models/K\x00imi"
    response = _client(operator).post("/api/deployments/",
                                      {"spec": data, "confirm_warnings": True},
                                      content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    assert any("NUL" in message for message in body[where]), body
    assert not Deployment.objects.filter(name="nul").exists()


@pytest.mark.parametrize("bad", ["env", "extra_args"])
def test_a_nul_byte_in_env_or_extra_args_is_refused_naming_the_item(operator, bad: str) -> None:  # type: ignore[no-untyped-def]
    data = spec(name="nul2")
    if bad == "env":
        data["env"] = {"NCCL_DEBUG": "IN\x00FO"}
        where = "env.NCCL_DEBUG"
    else:
        data["extra_args"] = ["--log-level", "in\x00fo"]
        where = "extra_args[1]"
    response = _client(operator).post("/api/deployments/",
                                      {"spec": data, "confirm_warnings": True},
                                      content_type="application/json")
    assert response.status_code == 400 and where in response.json(), response.json()


def test_an_unknown_status_filter_is_a_400_naming_the_choices(viewer) -> None:  # type: ignore[no-untyped-def]
    for value in ("\x00", "runing"):
        response = _client(viewer).get("/api/deployments/", {"status": value})
        assert response.status_code == 400
        assert "ready" in " ".join(response.json()["status"])
