"""Keys made, stored as hashes, scoped, validated and revoked; usage counted per key."""

from __future__ import annotations

import pytest

from tests.specs import spec
from web.deployments.models import Deployment
from web.gateway import selectors
from web.gateway.models import ApiKey, ApiKeyUsage
from web.gateway.services import (
    ApiKeyError,
    Usage,
    apikey_create,
    apikey_revoke,
    usage_record,
    usage_record_many,
)

pytestmark = pytest.mark.django_db


def deployment(name: str = "chatty") -> Deployment:
    return Deployment.objects.create(name=name, spec=spec(name=name), recipe="r",
                                     algorithm="DDTREE", status="ready")


def test_a_key_is_shown_once_and_kept_only_as_its_hash(operator) -> None:  # type: ignore[no-untyped-def]
    made = apikey_create(owner_username="otto", name="ci")
    row = ApiKey.objects.get()
    assert made.secret.startswith("sk-sd-" + row.prefix) and len(made.secret) > 40
    assert made.secret not in {row.digest, row.prefix, row.name}
    assert row.digest == selectors.secret_digest(made.secret)
    assert selectors.key_grant(secret=made.secret).id == row.id  # type: ignore[union-attr]
    assert selectors.key_grant(secret=made.secret + "x") is None


def test_it_scopes_a_key_to_the_deployments_named(operator) -> None:  # type: ignore[no-untyped-def]
    chatty, other = deployment(), deployment("other")
    made = apikey_create(owner_username="otto", name="one", deployment_ids=[other.pk])
    grant = selectors.key_grant(secret=made.secret)
    assert grant is not None and grant.allows(other.pk) and not grant.allows(chatty.pk)
    assert [k.name for k in selectors.api_keys_for_deployment(user=operator,
                                                              deployment=other)] == ["one"]
    assert selectors.api_keys_for_deployment(user=operator, deployment=chatty) == []


@pytest.mark.parametrize(("changes", "field"), [
    ({"name": ""}, "name"), ({"name": "x" * 101}, "name"),
    ({"rate_limit_per_minute": 0}, "rate_limit_per_minute"),
    ({"deployment_ids": [999999]}, "deployments"), ({"deployment_ids": []}, "deployments"),
])
def test_it_names_the_field_to_fix(operator, changes, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiKeyError) as refused:
        apikey_create(**{"owner_username": "otto", "name": "k", **changes})
    assert refused.value.field == field
    assert not ApiKey.objects.exists()


def test_only_operators_and_admins_hold_keys(viewer, admin) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiKeyError, match="not an operator"):
        apikey_create(owner_username="vera", name="k")
    assert apikey_create(owner_username="ada", name="k").key.owner == admin


def test_revoking_marks_the_key_and_keeps_its_usage(operator) -> None:  # type: ignore[no-untyped-def]
    made = apikey_create(owner_username="otto", name="k")
    usage_record(key_id=made.key.pk, user_id=None, deployment_id=deployment().pk,
                 prompt_tokens=3, completion_tokens=4)
    assert not apikey_revoke(prefix="sk-sd-" + made.key.prefix, owner_username="someone")
    assert apikey_revoke(prefix="sk-sd-" + made.key.prefix)
    assert not apikey_revoke(prefix=made.key.prefix)  # already revoked
    grant = selectors.key_grant(secret=made.secret)
    assert grant is not None and grant.revoked
    info = selectors.apikey_list(owner=operator)[0]
    assert info.revoked_at is not None and (info.requests, info.prompt_tokens) == (1, 3)


def test_usage_adds_up_per_key_and_deployment_and_per_session_user(operator) -> None:  # type: ignore[no-untyped-def]
    chatty = deployment()
    made = apikey_create(owner_username="otto", name="k")
    for tokens in (5, 7):
        usage_record(key_id=made.key.pk, user_id=None, deployment_id=chatty.pk,
                     prompt_tokens=2, completion_tokens=tokens)
    usage_record(key_id=None, user_id=operator.pk, deployment_id=chatty.pk,
                 prompt_tokens=1, completion_tokens=1)
    by_key = ApiKeyUsage.objects.get(key=made.key)
    assert (by_key.requests, by_key.prompt_tokens, by_key.completion_tokens) == (2, 4, 12)
    session = ApiKeyUsage.objects.get(key__isnull=True)
    assert (session.user, session.requests) == (operator, 1)
    assert made.key.__class__.objects.get().last_used_at is not None


def test_usage_of_several_requests_at_once_adds_up_per_key_deployment_and_user(operator) -> None:  # type: ignore[no-untyped-def]
    chatty, other = deployment(), deployment("other")
    made = apikey_create(owner_username="otto", name="k")
    usage_record(key_id=made.key.pk, user_id=None, deployment_id=chatty.pk,
                 prompt_tokens=1, completion_tokens=1)  # a row that exists already
    usage_record_many(usages=[
        Usage(key_id=made.key.pk, user_id=None, deployment_id=chatty.pk, prompt_tokens=2,
              completion_tokens=3),
        Usage(key_id=made.key.pk, user_id=operator.pk, deployment_id=chatty.pk,
              prompt_tokens=4, completion_tokens=-1),  # a key's: the user is not kept
        Usage(key_id=made.key.pk, user_id=None, deployment_id=other.pk, prompt_tokens=5,
              completion_tokens=6),
        Usage(key_id=None, user_id=operator.pk, deployment_id=chatty.pk, prompt_tokens=7,
              completion_tokens=8),
        Usage(key_id=None, user_id=operator.pk, deployment_id=chatty.pk, prompt_tokens=1,
              completion_tokens=1)])
    counts = {(u.key_id, u.user_id, u.deployment_id):
              (u.requests, u.prompt_tokens, u.completion_tokens)
              for u in ApiKeyUsage.objects.all()}
    assert counts == {(made.key.pk, None, chatty.pk): (3, 7, 4),
                      (made.key.pk, None, other.pk): (1, 5, 6),
                      (None, operator.pk, chatty.pk): (2, 8, 9)}
    assert ApiKey.objects.get().last_used_at is not None


@pytest.mark.django_db(transaction=True)
def test_the_gateway_stores_requests_that_end_together_in_fewer_writes(operator) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from web.gateway.usage import UsageWriter

    chatty = deployment()
    made = apikey_create(owner_username="otto", name="k")
    writer = UsageWriter()

    async def one(i: int) -> None:
        await asyncio.sleep(0.002 * (i % 7))  # ending at different moments
        await writer.record(Usage(key_id=made.key.pk, user_id=None, deployment_id=chatty.pk,
                                  prompt_tokens=1, completion_tokens=i))

    async def scenario() -> None:
        await asyncio.gather(*(one(i) for i in range(60)))

    asyncio.run(scenario())
    row = ApiKeyUsage.objects.get()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (60, 60, sum(range(60)))
    assert writer.stored == 60 and 1 <= writer.writes < 60  # together, not one write each
