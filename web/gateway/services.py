"""Writes for the gateway: keys made (the secret returned once, only its digest kept) and
revoked, usage counted from the engine's own numbers, and the per-key rate limit."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from web.deployments.models import Deployment
from web.deployments.permissions import can_deploy
from web.gateway.models import ApiKey, ApiKeyUsage
from web.gateway.selectors import KEY_PREFIX, PREFIX_LENGTH, secret_digest

MAX_NAME = 100
MAX_RATE_LIMIT = 1_000_000
# Bumped at each revocation: the gateway's cached grants are good only at the epoch they were
# read at (web/gateway/routing.py), so a revoked key stops at once in every panel process.
KEYS_EPOCH = "appliance:gateway:keys-epoch"
# Each new epoch is published too (keys_channel): a panel process that holds a subscription
# knows the epoch without asking Redis per request, and reads it per request when it does not.
KEYS_CHANNEL = "appliance:gateway:keys"


def keys_channel(client: redis.Redis | Any) -> str:
    """The epoch's channel for the client's database: Redis's channels are server-wide, and
    installs that share one server by database number must not hear each other's epochs."""
    return f"{KEYS_CHANNEL}:{client.connection_pool.connection_kwargs.get('db', 0)}"


class ApiKeyError(ValueError):
    """Bad input for a key: `field` names what to fix, the message says how."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class NewKey:
    key: ApiKey
    secret: str  # shown once to the person who made it; never stored


def _new_secret() -> tuple[str, str]:
    """(prefix, secret): the prefix is hex so it reads plainly in lists; the rest 256 bits."""
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    return prefix, f"{KEY_PREFIX}{prefix}{secrets.token_urlsafe(32)}"


def _checked(name: str, rate_limit_per_minute: int | None) -> str:
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME:
        raise ApiKeyError("name", f"give the key a name of 1 to {MAX_NAME} characters")
    if rate_limit_per_minute is not None and not 1 <= rate_limit_per_minute <= MAX_RATE_LIMIT:
        raise ApiKeyError("rate_limit_per_minute", "a rate limit is a whole number of "
                          f"requests per minute from 1 to {MAX_RATE_LIMIT}, or empty for none")
    return name


def _scope(deployment_ids: Sequence[int] | None) -> list[Deployment]:
    if deployment_ids is None:
        return []
    ids = sorted(set(deployment_ids))
    found = list(Deployment.objects.filter(pk__in=ids))
    missing = sorted(set(ids) - {d.pk for d in found})
    if missing:
        raise ApiKeyError("deployments", f"no deployment with id {missing[0]}: "
                          "list existing deployment ids, or leave it empty for all")
    if not found:
        raise ApiKeyError("deployments", "name at least one deployment, or leave the "
                          "scope as all deployments")
    # A replica row's id scopes its deployment: the key is for the served name, whichever
    # replica answers (the gateway checks a request against replica 0's id).
    roots = {d.replica_of_id for d in found if d.replica_of_id}
    return [d for d in found if not d.replica_of_id] + [
        d for d in Deployment.objects.filter(pk__in=roots) if d.pk not in ids]


def apikey_create(*, owner_username: str, name: str, deployment_ids: Sequence[int] | None = None,
                  rate_limit_per_minute: int | None = None) -> NewKey:
    """A new key for an operator (or admin): deployment_ids None means all deployments."""
    owner = get_user_model().objects.filter(username=owner_username).first()
    if owner is None:
        raise ApiKeyError("owner", f"no user {owner_username!r}")
    if not can_deploy(owner):
        raise ApiKeyError("owner", f"{owner_username} is not an operator: only operators and "
                          "admins may call deployments, so only they hold keys")
    name = _checked(name, rate_limit_per_minute)
    scope = _scope(deployment_ids)
    prefix, secret = _new_secret()
    with transaction.atomic():
        key = ApiKey.objects.create(name=name, owner=owner, prefix=prefix,
                                    digest=secret_digest(secret),
                                    all_deployments=deployment_ids is None,
                                    rate_limit_per_minute=rate_limit_per_minute)
        key.deployments.set(scope)
    return NewKey(key=key, secret=secret)


def apikey_revoke(*, prefix: str, owner_username: str | None = None) -> bool:
    """Revoke the key named by its prefix (`sk-sd-1a2b3c4d` or `1a2b3c4d`), only the owner's
    own when owner_username is given; False when there is no such unrevoked key."""
    bare = prefix.removeprefix(KEY_PREFIX)[:PREFIX_LENGTH]
    keys = ApiKey.objects.filter(prefix=bare, revoked_at__isnull=True)
    if owner_username is not None:
        keys = keys.filter(owner__username=owner_username)
    revoked = keys.update(revoked_at=timezone.now()) > 0
    if revoked:
        transaction.on_commit(_bump_epoch)
    return revoked


def _bump_epoch() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL,
                                  socket_timeout=settings.REDIS_SOCKET_TIMEOUT_S)
    client.eval(_BUMP_AND_PUBLISH, 1, KEYS_EPOCH, keys_channel(client))


# One script: no subscriber can see the new epoch in Redis without its message, or the reverse.
_BUMP_AND_PUBLISH = """
local epoch = redis.call("INCR", KEYS[1])
redis.call("PUBLISH", ARGV[1], epoch)
return epoch
"""


@dataclass(frozen=True)
class Usage:
    """One request's counts, as the engine told them."""

    key_id: int | None
    user_id: int | None
    deployment_id: int
    prompt_tokens: int
    completion_tokens: int


def usage_record(*, key_id: int | None, user_id: int | None, deployment_id: int,
                 prompt_tokens: int, completion_tokens: int) -> None:
    """Count one request: per key and deployment, or per user for a session (key None)."""
    usage_record_many(usages=[Usage(key_id=key_id, user_id=user_id,
                                    deployment_id=deployment_id, prompt_tokens=prompt_tokens,
                                    completion_tokens=completion_tokens)])


def usage_record_many(*, usages: Sequence[Usage]) -> None:
    """Count several requests at once, one update per key and deployment: the gateway's
    requests that end while a write is under way are written together (a write per request
    was most of what 1,000 concurrent streams cost over the engine called directly)."""
    now = timezone.now()
    groups: dict[tuple[int | None, int | None, int], list[int]] = {}
    for usage in usages:
        user_id = None if usage.key_id is not None else usage.user_id
        totals = groups.setdefault((usage.key_id, user_id, usage.deployment_id), [0, 0, 0])
        totals[0] += 1
        totals[1] += max(0, usage.prompt_tokens)
        totals[2] += max(0, usage.completion_tokens)
    keys = {key_id for key_id, _, _ in groups if key_id is not None}
    # One commit (one WAL flush) for them all, not one an update. The rows are taken in one
    # order (the keys in one statement, then the usage rows sorted) so panel processes
    # writing at once do not wait on each other in a circle.
    with transaction.atomic():
        if keys:
            ApiKey.objects.filter(pk__in=keys).update(last_used_at=now)
        for (key_id, user_id, deployment_id), (requests, prompt, completion) in sorted(
                groups.items(), key=lambda item: tuple(part or 0 for part in item[0])):
            _usage_add(key_id=key_id, user_id=user_id, deployment_id=deployment_id, now=now,
                       requests=requests, prompt_tokens=prompt, completion_tokens=completion)


def _usage_add(*, key_id: int | None, user_id: int | None, deployment_id: int, now: Any,
               requests: int, prompt_tokens: int, completion_tokens: int) -> None:
    match = ({"key_id": key_id} if key_id is not None else {"key__isnull": True,
                                                             "user_id": user_id})
    bump = {"requests": F("requests") + requests, "last_used_at": now,
            "prompt_tokens": F("prompt_tokens") + prompt_tokens,
            "completion_tokens": F("completion_tokens") + completion_tokens}
    rows = ApiKeyUsage.objects.filter(deployment_id=deployment_id, **match)
    if rows.update(**bump):
        return
    try:
        with transaction.atomic():
            ApiKeyUsage.objects.create(
                key_id=key_id, user_id=user_id, deployment_id=deployment_id,
                requests=requests, last_used_at=now, prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens)
    except IntegrityError:  # a concurrent first request made the row
        rows.update(**bump)


def rate_limit_key(*, key_id: int, now: float | None = None) -> tuple[str, int]:
    """The Redis counter of a key's current one-minute window, and seconds until it ends."""
    now = time.time() if now is None else now
    window = int(now // 60)
    return f"appliance:gateway:rate:{key_id}:{window}", max(1, (window + 1) * 60 - int(now))
