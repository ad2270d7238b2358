"""The spec's `secrets:` reach that deployment's container, from the secret store, and
nothing else: no row, event, API answer, Redis entry or container plan holds the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core import serializers
from django.test import Client, override_settings

from appliance.logs.appliance_causes import start_failure
from appliance.runtime.container_plan import docker_run_kwargs
from appliance.runtime.containers import EngineRuntimeError, secret_values
from appliance.runtime.secrets import ENV_PREFIX
from tests.plans import own_host_plan
from tests.specs import spec
from web.deployments import services
from web.deployments.models import Deployment, Event

pytestmark = pytest.mark.django_db

PLANTED = "hf_" + "PlantedSecretValue0123456789"


def _create(client: Client, **changes):  # type: ignore[no-untyped-def]
    response = client.post("/api/deployments/", {"spec": spec(**changes), "confirm_warnings": True},
                           content_type="application/json")
    assert response.status_code == 201, response.json()
    return Deployment.objects.get(pk=response.json()["id"])


def test_a_declared_secret_reaches_only_its_own_container(operator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "HF_TOKEN").write_text(PLANTED + "\n")
    client = Client()
    client.force_login(operator)
    with override_settings(ENGINE_SECRETS_DIR=str(tmp_path)):
        declared = _create(client, name="with-secret", secrets=["HF_TOKEN"])
        other = _create(client, name="without", gpus=[1])
        plan = own_host_plan(declared, "img", APPLIANCE_ENGINE_SECRETS_DIR=str(tmp_path))
        assert plan.secrets == ["HF_TOKEN"] and PLANTED not in json.dumps(plan.env)
        assert secret_values(plan) == {"HF_TOKEN": PLANTED}
        # Put into the container as a file, never its configuration (`docker inspect`).
        assert PLANTED not in repr(docker_run_kwargs(plan))
        assert secret_values(own_host_plan(
            other, "img", APPLIANCE_ENGINE_SECRETS_DIR=str(tmp_path))) == {}


def test_the_store_falls_back_to_the_agents_environment(operator, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         monkeypatch) -> None:
    client = Client()
    client.force_login(operator)
    # Pre-flight finds the name in the environment of this process (no agent reported).
    monkeypatch.setenv(f"{ENV_PREFIX}HF_TOKEN", PLANTED)
    with override_settings(ENGINE_SECRETS_DIR=str(tmp_path / "none")):
        plan = own_host_plan(_create(client, secrets=["HF_TOKEN"]), "img",
                             APPLIANCE_ENGINE_SECRETS_DIR=str(tmp_path / "none"))
    assert secret_values(plan, environ={f"{ENV_PREFIX}HF_TOKEN": PLANTED}) == {
        "HF_TOKEN": PLANTED}
    # The panel's own APPLIANCE_SECRET_KEY is no engine secret.
    with pytest.raises(EngineRuntimeError):
        secret_values(plan, environ={"APPLIANCE_SECRET_HF_TOKEN": PLANTED})


def test_a_missing_secret_fails_the_start_naming_it_and_the_fix(operator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator)
    (tmp_path / "HF_TOKEN").write_text(PLANTED)
    with override_settings(ENGINE_SECRETS_DIR=str(tmp_path)):
        plan = own_host_plan(_create(client, secrets=["HF_TOKEN"]), "img",
                             APPLIANCE_ENGINE_SECRETS_DIR=str(tmp_path))
    # Gone after pre-flight passed (pre-flight refuses a spec whose secret is missing).
    (tmp_path / "HF_TOKEN").unlink()
    with pytest.raises(EngineRuntimeError) as caught:
        secret_values(plan, environ={})
    diagnosis = start_failure(str(caught.value))
    assert "HF_TOKEN" in str(caught.value) and diagnosis.cause == "secret-missing"


def test_a_planted_secret_is_in_no_row_event_answer_or_stream(operator, viewer, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              live_channel) -> None:
    (tmp_path / "HF_TOKEN").write_text(PLANTED)
    client = Client()
    client.force_login(operator)
    with override_settings(ENGINE_SECRETS_DIR=str(tmp_path)):
        deployment = _create(client, secrets=["HF_TOKEN"])
        secret_values(own_host_plan(deployment, "img",
                                    APPLIANCE_ENGINE_SECRETS_DIR=str(tmp_path)))
    services.deployment_stop(deployment_id=deployment.pk)
    dump = serializers.serialize("json", [*Deployment.objects.all(), *Event.objects.all()])
    assert PLANTED not in dump
    reader = Client()
    reader.force_login(viewer)
    for path in ("/api/deployments/", f"/api/deployments/{deployment.pk}/",
                 f"/api/deployments/{deployment.pk}/events/",
                 f"/api/deployments/{deployment.pk}/summary/", f"/deployments/{deployment.pk}/"):
        assert PLANTED not in reader.get(path).content.decode(), path
    for key in live_channel.scan_iter("*"):
        if live_channel.type(key) == b"stream":
            assert PLANTED.encode() not in repr(live_channel.xrange(key)).encode()


def test_a_secret_value_in_a_spec_is_refused_and_not_echoed(operator) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator)
    for dressed in (f"  {PLANTED}  ", f"Bearer {PLANTED}"):
        response = client.post("/api/deployments/",
                               {"spec": spec(env={"MY_VAR": dressed}), "confirm_warnings": True},
                               content_type="application/json")
        assert response.status_code == 400 and "env.MY_VAR" in response.json()
        assert PLANTED not in response.content.decode()
    assert not Deployment.objects.exists()
