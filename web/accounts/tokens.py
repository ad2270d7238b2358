"""API tokens: made (the token is shown once, only its hash is kept) with a role no larger
than their user's, listed, revoked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from knox.models import AuthToken
from knox.settings import CONSTANTS, knox_settings

from web.accounts.models import TokenScope
from web.deployments.permissions import roles_of


class TokenRoleError(ValueError):
    """The role asked for is not one the user holds; the message names the ones it does."""


def token_create(*, username: str, role: str | None = None,
                 ttl_days: int | None = None) -> tuple[AuthToken, str]:
    """A new token for a user, scoped to `role` (default: the largest role the user has):
    (its row, the token itself, which is not stored)."""
    user = get_user_model().objects.get(username=username)
    held = roles_of(user)
    role = role or (held[-1] if held else None)
    if role not in held:
        raise TokenRoleError(f"{username} cannot have a {role or 'role-less'} token: "
                             f"the roles it holds are {', '.join(held) or 'none'}")
    expiry: Any = knox_settings.TOKEN_TTL if ttl_days is None else (
        timedelta(days=ttl_days) if ttl_days > 0 else None)
    with transaction.atomic():
        instance, token = AuthToken.objects.create(user=user, expiry=expiry)
        TokenScope.objects.create(token=instance, role=role)
    return instance, token


def token_list(*, username: str | None = None) -> list[AuthToken]:
    tokens = AuthToken.objects.select_related("user", "scope").order_by("created")
    if username:
        tokens = tokens.filter(user__username=username)
    return list(tokens)


def token_revoke(*, key: str, username: str | None = None) -> int:
    """Revoke the tokens whose key (their first characters, as `apitoken list` shows)
    matches, only the user's own when a username is given; the number revoked."""
    tokens = AuthToken.objects.filter(token_key=key[:CONSTANTS.TOKEN_KEY_LENGTH])
    if username is not None:
        tokens = tokens.filter(user__username=username)
    _, per_model = tokens.delete()
    return per_model.get(AuthToken._meta.label, 0)
