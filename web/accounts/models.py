"""An API token's role: what a request made with it may do, never more than its user."""

from __future__ import annotations

from django.db import models
from knox.models import AuthToken


class TokenRole(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"


class TokenScope(models.Model):
    """One per token made here; a token without one (made before scopes) acts as its user."""

    token = models.OneToOneField(AuthToken, primary_key=True, on_delete=models.CASCADE,
                                 related_name="scope")
    role = models.CharField(max_length=16, choices=TokenRole.choices)

    def __str__(self) -> str:
        return f"{self.token.token_key} ({self.role})"
