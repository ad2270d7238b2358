"""API tokens: made (the token is shown once, only its hash is kept), listed, revoked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from knox.models import AuthToken
from knox.settings import CONSTANTS, knox_settings


def token_create(*, username: str, ttl_days: int | None = None) -> tuple[AuthToken, str]:
    """A new token for a user: (its row, the token itself, which is not stored)."""
    user = get_user_model().objects.get(username=username)
    expiry: Any = knox_settings.TOKEN_TTL if ttl_days is None else (
        timedelta(days=ttl_days) if ttl_days > 0 else None)
    instance, token = AuthToken.objects.create(user=user, expiry=expiry)
    return instance, token


def token_list(*, username: str | None = None) -> list[AuthToken]:
    tokens = AuthToken.objects.select_related("user").order_by("created")
    if username:
        tokens = tokens.filter(user__username=username)
    return list(tokens)


def token_revoke(*, key: str) -> int:
    """Revoke the tokens whose key (their first characters, as `apitoken list` shows)
    matches; the number revoked."""
    deleted, _ = AuthToken.objects.filter(token_key=key[:CONSTANTS.TOKEN_KEY_LENGTH]).delete()
    return deleted
