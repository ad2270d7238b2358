"""The API keys page: an operator makes a key (shown once), sees it listed with scope and
usage, revokes it; a viewer may not."""

from __future__ import annotations

import re

import pytest

from tests.specs import spec
from web.deployments.models import Deployment
from web.gateway.models import ApiKey

pytestmark = pytest.mark.django_db


def test_an_operator_makes_a_key_and_sees_it_only_once(client, operator) -> None:  # type: ignore[no-untyped-def]
    chatty = Deployment.objects.create(name="chatty", spec=spec(name="chatty"), recipe="r",
                                       algorithm="DDTREE", status="ready")
    client.force_login(operator)
    made = client.post("/keys/", {"name": "evals", "deployments": [chatty.pk],
                                  "rate_limit_per_minute": "60"})
    assert made.status_code == 200
    secret = re.search(r"sk-sd-[A-Za-z0-9_-]{40,}", made.content.decode()).group(0)  # type: ignore[union-attr]
    key = ApiKey.objects.get()
    assert (key.name, key.all_deployments, key.rate_limit_per_minute) == ("evals", False, 60)
    listed = client.get("/keys/").content.decode()
    assert secret not in listed and f"sk-sd-{key.prefix}" in listed
    assert "chatty" in listed and "60/min" in listed and "never" in listed


def test_a_bad_rate_limit_is_a_form_error_and_no_key(client, operator) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    answer = client.post("/keys/", {"name": "x", "rate_limit_per_minute": "0"})
    assert answer.status_code == 400
    assert "greater than or equal to 1" in answer.content.decode()
    assert not ApiKey.objects.exists()


def test_revoking_from_the_page_stops_the_key(client, operator) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    client.post("/keys/", {"name": "k"})
    key = ApiKey.objects.get()
    answer = client.post(f"/keys/sk-sd-{key.prefix}/revoke/", follow=True)
    assert "revoked" in answer.content.decode()
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_a_viewer_may_not_hold_keys(client, viewer) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    assert client.get("/keys/").status_code == 403
    assert client.post("/keys/", {"name": "k"}).status_code == 403
    assert not ApiKey.objects.exists()


def test_another_operators_key_cannot_be_revoked(client, operator, django_user_model) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    client.post("/keys/", {"name": "mine"})
    key = ApiKey.objects.get()
    other = django_user_model.objects.create_user(username="olga", password="p-1-olga-pass")
    other.groups.set(operator.groups.all())
    client.force_login(other)
    assert f"sk-sd-{key.prefix}" not in client.get("/keys/").content.decode()
    client.post(f"/keys/{key.prefix}/revoke/")
    key.refresh_from_db()
    assert key.revoked_at is None


def test_a_deployment_with_replicas_is_one_choice_and_a_replicas_id_scopes_it(client, operator) -> None:  # type: ignore[no-untyped-def]
    from tests.rows import queued
    from web.gateway import services

    first = queued(name="fleet", gpus=[0], replicas=3)
    rows = list(Deployment.objects.filter(replica_of=first).order_by("replica_index"))
    client.force_login(operator)
    page = client.get("/keys/").content.decode()
    boxes = re.findall(r'name="deployments" value="(\d+)"', page)
    assert boxes == [str(first.pk)]  # one choice for the deployment, none per replica row
    assert f"fleet (#{first.pk}, queued, 3 replicas)" in page
    key = services.apikey_create(owner_username=operator.username, name="r",
                                 deployment_ids=[rows[1].pk]).key
    assert list(key.deployments.values_list("pk", flat=True)) == [first.pk]


def test_usage_shows_per_deployment_that_served_with_the_companions_share(client, operator, token_for) -> None:  # type: ignore[no-untyped-def]
    from tests.rows import queued
    from web.gateway import services

    base = queued(name="base", gpus=[1], engine__speculative_algorithm="NONE")
    ddt = queued(name="ddt", gpus=[0], companion="base")
    key = services.apikey_create(owner_username=operator.username, name="evals").key
    for _ in range(3):  # three answered by the DDTree engine
        services.usage_record(key_id=key.pk, user_id=None, deployment_id=ddt.pk,
                              prompt_tokens=10, completion_tokens=20)
    # one log-probs request the DDTree engine refuses, served by its companion
    services.usage_record(key_id=key.pk, user_id=None, deployment_id=base.pk,
                          prompt_tokens=7, completion_tokens=1)
    client.force_login(operator)
    page = client.get("/keys/").content.decode()
    assert "<b>ddt</b>: 3 requests, 30 + 60 tokens" in page
    assert "<b>base (companion of ddt)</b>: 1 request, 7 + 1 tokens" in page
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(operator)}"}
    for answer in (client.get("/api/keys/", **auth).json()[0],
                   client.get(f"/api/keys/{key.pk}/", **auth).json()):
        assert (answer["requests"], answer["prompt_tokens"], answer["completion_tokens"]) == (
            4, 37, 61)
        shares = {u["deployment"]: (u["deployment_id"], u["companion_of"], u["requests"],
                                    u["prompt_tokens"], u["completion_tokens"])
                  for u in answer["usage"]}
        assert shares == {"ddt": (ddt.pk, [], 3, 30, 60), "base": (base.pk, ["ddt"], 1, 7, 1)}
