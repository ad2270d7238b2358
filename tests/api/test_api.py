from __future__ import annotations

import re

import pytest
import yaml
from rest_framework.test import APIClient

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment

pytestmark = pytest.mark.django_db


def _client(token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_it_refuses_requests_without_a_token():  # type: ignore[no-untyped-def]
    assert _client().get("/api/deployments/").status_code == 401


def test_an_operator_creates_a_deployment_with_a_token(operator, token_for):  # type: ignore[no-untyped-def]
    response = _client(token_for(operator)).post(
        "/api/deployments/", {"spec": spec(), "confirm_warnings": True}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "queued" and body["name"] == "kimi-ddtree"
    assert Deployment.objects.filter(pk=body["id"]).exists()
    assert body["rebuild_image"] is False and body["spec"]["self_check"] is True


def test_a_rebuild_can_be_asked_for_and_a_non_boolean_is_a_field_error(operator, token_for):  # type: ignore[no-untyped-def]
    api = _client(token_for(operator))
    response = api.post("/api/deployments/", {"spec": spec(), "confirm_warnings": True,
                                              "rebuild_image": True}, format="json")
    assert response.status_code == 201 and response.json()["rebuild_image"] is True
    bad = api.post("/api/deployments/", {"spec": spec(name="other"), "confirm_warnings": True,
                                         "rebuild_image": "sometimes"}, format="json")
    assert bad.status_code == 400 and "rebuild_image" in bad.json()
    bad = api.post("/api/deployments/", {"spec": spec(name="other", self_check="sometimes"),
                                         "confirm_warnings": True}, format="json")
    assert bad.status_code == 400 and "self_check" in str(bad.json())
    assert Deployment.objects.count() == 1


def test_a_viewer_reads_but_cannot_create_or_stop(viewer, operator, token_for):  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    client = _client(token_for(viewer))
    assert client.get(f"/api/deployments/{deployment.pk}/").status_code == 200
    created = client.post("/api/deployments/", {"spec": spec()}, format="json")
    assert created.status_code == 403
    assert client.post(f"/api/deployments/{deployment.pk}/stop/").status_code == 403


def test_invalid_input_answers_400_with_field_errors(operator, token_for):  # type: ignore[no-untyped-def]
    client = _client(token_for(operator))
    bad = spec(gpus="all", engine__tp_size="eight")
    response = client.post("/api/deployments/", {"spec": bad, "confirm_warnings": True}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert "gpus" in body and "engine.tp_size" in body
    not_json = client.post("/api/deployments/", "{", content_type="application/json")
    assert not_json.status_code == 400
    missing = client.post("/api/deployments/", {}, format="json")
    assert missing.status_code == 400 and "spec" in missing.json()
    assert Deployment.objects.count() == 0


def test_a_ddtree_spec_whose_recipe_lacks_the_width_patch_is_refused_before_the_load(  # type: ignore[no-untyped-def]
    operator, token_for
):
    body = spec(recipe="kimi-k2.6-dflash")
    response = _client(token_for(operator)).post(
        "/api/deployments/", {"spec": body, "confirm_warnings": True}, format="json"
    )
    assert response.status_code == 400
    rules = {f["rule"] for f in response.json()["preflight"]}
    assert "ddtree-verify-width" in rules


def test_events_are_paged_by_seq(operator, token_for):  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    services.events_append(
        deployment_id=deployment.pk, events=[("log", {"text": f"line {i}"}) for i in range(10)]
    )
    client = _client(token_for(operator))
    first = client.get(f"/api/deployments/{deployment.pk}/events/?limit=5").json()
    assert [e["seq"] for e in first["results"]] == [1, 2, 3, 4, 5]
    rest = client.get(f"/api/deployments/{deployment.pk}/events/?after={first['next_after']}").json()
    assert rest["results"][0]["seq"] == 6 and rest["next_after"] is None
    bad = client.get(f"/api/deployments/{deployment.pk}/events/?limit=zero")
    assert bad.status_code == 400 and "limit" in bad.json()


def test_summary_and_stop(operator, token_for):  # type: ignore[no-untyped-def]
    deployment = deploying.deployment_create(data=spec(), confirm_warnings=True)
    client = _client(token_for(operator))
    summary = client.get(f"/api/deployments/{deployment.pk}/summary/").json()
    assert summary["status"] == "queued" and summary["phase"] == ""
    stopped = client.post(f"/api/deployments/{deployment.pk}/stop/")
    assert stopped.status_code == 202 and stopped.json()["status"] == "stopped"


def test_preflight_endpoint_reports_findings_without_deploying(operator, token_for):  # type: ignore[no-untyped-def]
    response = _client(token_for(operator)).post("/api/preflight/", {"spec": spec()}, format="json")
    assert response.status_code == 200
    assert any(f["rule"] == "ddtree-verify-width" for f in response.json()["findings"])
    assert Deployment.objects.count() == 0


def test_the_openapi_schema_and_docs_are_served_locally(operator, client):  # type: ignore[no-untyped-def]
    client.force_login(operator)
    schema = client.get("/api/schema/")
    assert schema.status_code == 200 and b"/api/deployments/" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    # Every script, style and icon from this server. (A search for "cdn" in the page failed
    # once in CI: the page's random CSRF token held those three letters.)
    assets = re.findall(rb'(?:src|href)="([^"]*)"', docs.content)
    assert assets and all(a.startswith(b"/static/") for a in assets), assets
    assert not re.search(rb"https?://", docs.content), "the docs page names another host"


def test_a_recipe_path_is_refused_over_the_api(operator, token_for):  # type: ignore[no-untyped-def]
    body = spec(recipe="/etc/passwd")
    response = _client(token_for(operator)).post(
        "/api/deployments/", {"spec": body, "confirm_warnings": True}, format="json"
    )
    assert response.status_code == 400
    assert "kimi-k2.6-ddtree" in response.json()["recipe"][0]


def _post_yaml(api: APIClient, path: str, text: str):  # type: ignore[no-untyped-def]
    return api.generic("POST", path, text.encode(), content_type="application/yaml")


def test_a_spec_file_posted_as_yaml_creates_the_deployment(operator, token_for):  # type: ignore[no-untyped-def]
    api = _client(token_for(operator))
    response = _post_yaml(api, "/api/deployments/?confirm_warnings=true",
                          yaml.safe_dump(spec(name="from-yaml")))
    assert response.status_code == 201, response.json()
    created = Deployment.objects.get(pk=response.json()["id"])
    assert created.name == "from-yaml" and created.spec["engine"]["tp_size"] == 1


def test_a_wrapped_spec_in_yaml_carries_its_own_flags(operator, token_for):  # type: ignore[no-untyped-def]
    api = _client(token_for(operator))
    text = yaml.safe_dump({"spec": spec(name="wrapped"), "confirm_warnings": True,
                           "rebuild_image": True})
    response = _post_yaml(api, "/api/deployments/", text)
    assert response.status_code == 201, response.json()
    assert response.json()["rebuild_image"] is True and response.json()["name"] == "wrapped"


def test_a_bare_json_spec_is_taken_with_its_flags_from_the_query(operator, token_for):  # type: ignore[no-untyped-def]
    api = _client(token_for(operator))
    response = api.post("/api/deployments/?confirm_warnings=1&rebuild_image=yes", spec(name="bare"),
                        format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["name"] == "bare" and response.json()["rebuild_image"] is True
    wrong = api.post("/api/deployments/?confirm_warnings=perhaps", spec(name="bare"),
                     format="json")
    assert wrong.status_code == 400 and "confirm_warnings" in wrong.json()


def test_bad_yaml_is_a_400_naming_the_line_and_the_problem(operator, token_for):  # type: ignore[no-untyped-def]
    api = _client(token_for(operator))
    response = _post_yaml(api, "/api/deployments/", "name: x\nrecipe: [kimi\ngpus: [0]\n")
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("YAML parse error - line 3, column 5: ") and "expected ','" in detail
    assert Deployment.objects.count() == 0


@pytest.mark.parametrize(("text", "problem"), [
    ("- name: x\n", "The body must be a deployment spec"),
    ("", "The body is empty"),
    ("name: &n x\nrecipe: *n\n", "aliases (*name) are not accepted"),
    ("name: x\ngpus: !!set {0: null}\n", "a set value, which JSON has no type for"),
    ("name: x\n1: y\n", "a key that is not a string (1); quote it"),
])
def test_a_yaml_body_that_is_no_spec_is_a_400_that_says_why(operator, token_for, text, problem):  # type: ignore[no-untyped-def]
    response = _post_yaml(_client(token_for(operator)), "/api/deployments/", text)
    assert response.status_code == 400
    assert problem in str(response.json())


def test_a_date_like_yaml_value_stays_a_string(operator, token_for):  # type: ignore[no-untyped-def]
    text = yaml.safe_dump(spec()).replace("name: kimi-ddtree", "name: 2026-01-12")
    response = _post_yaml(_client(token_for(operator)), "/api/deployments/?confirm_warnings=1",
                          text)
    assert response.status_code == 201, response.json()
    assert response.json()["name"] == "2026-01-12"


def test_preflight_takes_a_bare_yaml_spec(operator, token_for):  # type: ignore[no-untyped-def]
    response = _post_yaml(_client(token_for(operator)), "/api/preflight/",
                          yaml.safe_dump(spec()))
    assert response.status_code == 200, response.json()
    assert any(f["rule"] == "ddtree-verify-width" for f in response.json()["findings"])


def test_the_openapi_schema_documents_yaml_and_bare_spec_bodies(operator, client):  # type: ignore[no-untyped-def]
    client.force_login(operator)
    schema = client.get("/api/schema/", {"format": "json"}).json()
    create = schema["paths"]["/api/deployments/"]["post"]
    content = create["requestBody"]["content"]
    assert set(content) >= {"application/json", "application/yaml"}
    wrapped, bare = content["application/yaml"]["schema"]["oneOf"]
    assert wrapped["required"] == ["spec"] and "confirm_warnings" in wrapped["properties"]
    assert bare["required"] == ["name", "recipe", "gpus"]
    assert "nullable" in str(bare) and "propertyNames" not in str(bare)
    assert {p["name"] for p in create["parameters"]} >= {"confirm_warnings", "rebuild_image"}
    assert "application/yaml" in create["description"]
    preflight = schema["paths"]["/api/preflight/"]["post"]["requestBody"]["content"]
    assert "application/yaml" in preflight


def test_a_rebuild_is_refused_where_the_panel_runs_a_fixed_image(operator, token_for, settings):  # type: ignore[no-untyped-def]
    settings.ENGINE_IMAGE = "engine:fixed"
    api = _client(token_for(operator))
    refused = api.post("/api/deployments/", {"spec": spec(), "confirm_warnings": True,
                                             "rebuild_image": True}, format="json")
    assert refused.status_code == 400
    assert "fixed image engine:fixed" in refused.json()["rebuild_image"][0]
    assert not Deployment.objects.exists()
    created = api.post("/api/deployments/", {"spec": spec(), "confirm_warnings": True},
                       format="json")
    assert created.status_code == 201 and created.json()["rebuild_image"] is False
