"""A served model name belongs to one active deployment: a second one (a Clone onto other
GPUs) is refused at create and at restart, in the service, the API and the form, naming the
holder and the fix; once the holder has ended the name is free again."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus


def _create(**changes: Any) -> Deployment:
    return deploying.deployment_create(data=spec(**changes), confirm_warnings=True)


def _refusal(**changes: Any) -> dict[str, list[str]]:
    with pytest.raises(services.DeploymentInputError) as caught:
        _create(**changes)
    return caught.value.errors


def _holder_text(holder: Deployment, served: str, other: str) -> str:
    return (f"The served model name {served!r} is already served by deployment #{holder.pk} "
            f"'{holder.name}' ({holder.status}): a served name belongs to one active "
            f"deployment, or the gateway could not tell them apart. Stop #{holder.pk} first, "
            f"or choose {other}.")


NAME_FIX = ("another name (or set engine.served_model_name, --served-model-name in the extra "
            "arguments)")
SERVED_FIX = ("another served model name (engine.served_model_name, or --served-model-name in "
              "the extra arguments)")


@pytest.mark.django_db
def test_a_clone_onto_other_gpus_is_refused_naming_the_holder_and_the_fix() -> None:
    holder = _create(gpus=[0])
    errors = _refusal(gpus=[1])  # the same spec, other GPUs: what Clone makes
    assert errors == {"name": [_holder_text(holder, "kimi-ddtree", NAME_FIX)]}
    assert list(Deployment.objects.values_list("pk", flat=True)) == [holder.pk]


@pytest.mark.django_db
def test_a_clone_as_it_is_is_told_of_its_gpu_and_its_name_at_once() -> None:
    holder = _create(gpus=[0])
    errors = _refusal(gpus=[0])
    assert errors["name"] == [_holder_text(holder, "kimi-ddtree", NAME_FIX)]
    assert errors["gpus"] == [f"GPU 0 on host gpu-host is held by deployment #{holder.pk} "
                              "'kimi-ddtree' (queued); stop it or choose other GPUs."]


@pytest.mark.django_db
def test_a_served_model_name_is_one_deployments_whatever_the_names() -> None:
    holder = _create(name="first", gpus=[0], engine__served_model_name="kimi")
    errors = _refusal(name="second", gpus=[1], engine__served_model_name="kimi")
    assert errors == {"engine.served_model_name": [_holder_text(holder, "kimi", SERVED_FIX)]}
    # A deployment's name is its served name when it sets none: "kimi" is taken as a name too.
    assert _refusal(name="kimi", gpus=[2]) == {"name": [_holder_text(holder, "kimi", NAME_FIX)]}
    # ... and the holder's own name is free: it serves "kimi", not "first".
    assert _create(name="first", gpus=[3]).status == DeploymentStatus.QUEUED


@pytest.mark.django_db
def test_the_name_is_free_once_its_holder_ended_and_a_restart_is_refused_while_taken() -> None:
    first = _create(gpus=[0])
    services.deployment_stop(deployment_id=first.pk)  # queued: stopped at once
    second = _create(gpus=[1])
    with pytest.raises(services.DeploymentInputError) as caught:
        services.deployment_restart(deployment_id=first.pk)
    assert caught.value.errors == {"name": [_holder_text(second, "kimi-ddtree", NAME_FIX)]}
    first.refresh_from_db()
    assert (first.status, first.run) == (DeploymentStatus.STOPPED, 1)  # nothing changed
    services.deployment_stop(deployment_id=second.pk)
    assert services.deployment_restart(deployment_id=first.pk).status == DeploymentStatus.QUEUED


@pytest.mark.django_db
def test_the_api_answers_400_naming_the_field_and_the_holder(operator) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator)
    first = client.post("/api/deployments/", {"spec": spec(gpus=[0]), "confirm_warnings": True},
                        content_type="application/json")
    assert first.status_code == 201
    second = client.post("/api/deployments/", {"spec": spec(gpus=[1]), "confirm_warnings": True},
                         content_type="application/json")
    assert second.status_code == 400
    holder = Deployment.objects.get(pk=first.json()["id"])
    assert second.json()["name"] == [_holder_text(holder, "kimi-ddtree", NAME_FIX)]
    restart = client.post(f"/api/deployments/{holder.pk}/restart/")
    assert restart.status_code == 400  # not ended: a restart of the holder itself says so


@pytest.mark.django_db
def test_the_form_shows_the_refusal_beside_the_name_and_the_extra_arguments(operator) -> None:  # type: ignore[no-untyped-def]
    holder = _create(gpus=[0], engine__served_model_name="kimi")
    client = Client()
    client.force_login(operator)
    form = {"recipe": "kimi-k2.6-ddtree", "name": "kimi", "model_path": "/models/Kimi-K2.6",
            "drafter_path": "/models/Kimi-K2.6-DFlash", "algorithm": "DDTREE",
            "block_size": "8", "tree_budget": "32", "tp_size": "1", "gpu_ids": "1",
            "attention_backend": "fa3", "self_check": "on", "confirm_warnings": "on"}
    page = client.post("/deployments/new/", form)
    assert page.status_code == 400
    assert page.context["form"].errors["name"] == [_holder_text(holder, "kimi", NAME_FIX)]
    page = client.post("/deployments/new/", {**form, "name": "other",
                                             "extra_args": "--served-model-name kimi"})
    assert page.status_code == 400
    assert page.context["form"].errors["extra_args"] == [
        _holder_text(holder, "kimi", SERVED_FIX)]
    assert "already served by deployment" in page.content.decode()
    assert Deployment.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_of_four_concurrent_creations_of_one_name_exactly_one_wins() -> None:
    """Each on GPUs of its own: only the name is shared, and the lock on it decides."""
    start = threading.Barrier(4)
    won: list[int] = []
    refused: list[str] = []

    def attempt(n: int) -> None:
        start.wait(10)
        try:
            won.append(_create(gpus=[n]).pk)
        except services.DeploymentInputError as exc:
            refused.extend(exc.errors["name"])
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(won) == 1 and len(refused) == 3, (won, refused)
    assert all(f"deployment #{won[0]} 'kimi-ddtree'" in text for text in refused)
    assert list(Deployment.objects.values_list("pk", flat=True)) == won
