"""API tokens, stored as hashes only (django-rest-knox): `Authorization: Token <token>`."""

from __future__ import annotations

import re
from hmac import compare_digest
from typing import Any

from django.utils import timezone
from knox.auth import TokenAuthentication
from knox.crypto import hash_token
from knox.models import AuthToken
from knox.settings import CONSTANTS, knox_settings
from knox.signals import token_expired
from rest_framework import exceptions

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
        # Only a token's own characters reach the database (a NUL there is a DataError).
        if len(token) > MAX_TOKEN_LENGTH or not _TOKEN.fullmatch(token):
            raise exceptions.AuthenticationFailed("Invalid token.")
        text = token.decode()
        digest = hash_token(text)
        candidates = AuthToken.objects.filter(
            token_key=text[:CONSTANTS.TOKEN_KEY_LENGTH]).select_related("user", "scope")
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


def _role(auth_token: AuthToken) -> str | None:
    try:
        return str(auth_token.scope.role)
    except TokenScope.DoesNotExist:  # a token made before scopes acts as its user
        return None
