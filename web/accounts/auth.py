"""API tokens, stored as hashes only (django-rest-knox): `Authorization: Token <token>`."""

from __future__ import annotations

import re
from datetime import datetime
from hmac import compare_digest
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from knox.auth import TokenAuthentication
from knox.crypto import hash_token
from knox.models import AuthToken
from knox.settings import CONSTANTS, knox_settings
from knox.signals import token_expired
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header

from web.accounts.models import TokenScope

# A token is the prefix and 64 hex digits; anything much longer is not one of ours.
MAX_TOKEN_LENGTH = 128
_TOKEN = re.compile(rb"[A-Za-z0-9_-]+")


class HashedTokenAuthentication(TokenAuthentication):
    """knox's authentication in one query (the token with its user and its scope), with a
    malformed header a 401 rather than a 500.

    knox's own also lists all the user's tokens on every request to delete the expired
    ones among them (a query, and a write on a read); here an expired token is refused and
    deleted when it is used, as knox does with the one presented.
    """

    def authenticate_credentials(self, token: bytes) -> Any:
        if not token_well_formed(token):
            raise exceptions.AuthenticationFailed("Invalid token.")
        text = token.decode()
        digest = hash_token(text)
        candidates = AuthToken.objects.filter(
            token_key=token_key(text)).select_related("user", "scope")
        for auth_token in candidates:
            if not compare_digest(digest, auth_token.digest):
                continue
            if auth_token.expiry is not None and auth_token.expiry < timezone.now():
                self._expire(auth_token)
                break
            if knox_settings.AUTO_REFRESH and auth_token.expiry:
                self.renew_token(auth_token)
            user, auth_token = self.validate_user(auth_token)
            # The request may do what the token's role allows (web.deployments.permissions);
            # the user row is loaded for this request only, so the mark goes no further.
            user.token_role = _role(auth_token)
            return user, auth_token
        raise exceptions.AuthenticationFailed("Invalid token.")

    def _expire(self, auth_token: AuthToken) -> None:
        username = auth_token.user.get_username()
        auth_token.delete()
        token_expired.send(sender=self.__class__, username=username, source="auth_token")


def token_well_formed(token: bytes) -> bool:
    # Only a token's own characters reach the database (a NUL there is a DataError).
    return len(token) <= MAX_TOKEN_LENGTH and _TOKEN.fullmatch(token) is not None


def token_key(token: str) -> str:
    """What knox looks a token up by (its first characters, stored in the clear)."""
    return token[:CONSTANTS.TOKEN_KEY_LENGTH]


def token_in_header(request: HttpRequest) -> str | None:
    """The token of an `Authorization: Token <token>` header as knox reads it, when it is
    well formed; None for anything else: no header, another scheme (the session's), or a
    header HashedTokenAuthentication answers with its own 401."""
    auth = get_authorization_header(request).split()  # type: ignore[arg-type]  # .headers only
    if len(auth) != 2 or auth[0].lower() != knox_settings.AUTH_HEADER_PREFIX.encode().lower():
        return None
    return auth[1].decode() if token_well_formed(auth[1]) else None


def token_accepted(*, digest: str, stored_digest: str, expiry: datetime | None,
                   user_active: bool) -> bool:
    """Whether HashedTokenAuthentication lets the presented token (`digest`, its
    hash_token) in as this stored one, with nothing to write: the digests match, it has
    not expired (an expired one it deletes), its user is active, and knox does not renew
    it (AUTO_REFRESH). False sends a request the whole way, where each refusal is made."""
    return (compare_digest(digest, stored_digest) and user_active
            and not (expiry is not None and expiry < timezone.now())
            and not (knox_settings.AUTO_REFRESH and expiry))


def _role(auth_token: AuthToken) -> str | None:
    try:
        return str(auth_token.scope.role)
    except TokenScope.DoesNotExist:  # a token made before scopes acts as its user
        return None
