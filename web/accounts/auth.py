"""API tokens, stored as hashes only (django-rest-knox): `Authorization: Token <token>`."""

from __future__ import annotations

import re
from typing import Any

from knox.auth import TokenAuthentication
from rest_framework import exceptions

from web.accounts.models import TokenScope

# A token is the prefix and 64 hex digits; anything much longer is not one of ours.
MAX_TOKEN_LENGTH = 128
_TOKEN = re.compile(rb"[A-Za-z0-9_-]+")


class HashedTokenAuthentication(TokenAuthentication):
    """knox's authentication, with a malformed header a 401 rather than a 500."""

    def authenticate_credentials(self, token: bytes) -> Any:
        # Only a token's own characters reach the database (a NUL there is a DataError).
        if len(token) > MAX_TOKEN_LENGTH or not _TOKEN.fullmatch(token):
            raise exceptions.AuthenticationFailed("Invalid token.")
        user, auth_token = super().authenticate_credentials(token)
        # The request may do what the token's role allows (web.deployments.permissions);
        # the user row is loaded for this request only, so the mark goes no further.
        user.token_role = TokenScope.objects.filter(token=auth_token).values_list(
            "role", flat=True).first()
        return user, auth_token
