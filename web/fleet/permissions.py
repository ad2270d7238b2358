"""Who may do what with the fleet: viewers see hosts; admins make join tokens, drain and
remove hosts (as with API keys, an admin is a superuser, whatever its token's role)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from web.deployments.permissions import can_view


def can_view_fleet(user: AbstractBaseUser | AnonymousUser) -> bool:
    return can_view(user) or can_manage_fleet(user)


def can_manage_fleet(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and getattr(user, "is_superuser", False))
