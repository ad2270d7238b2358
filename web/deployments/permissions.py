"""Who may do what. Named actors: a viewer reads, an operator deploys and stops, an admin all.

Roles are Django permissions on the Deployment model, so new roles are groups, not code.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

VIEW_PERMISSION = "deployments.view_deployment"
DEPLOY_PERMISSION = "deployments.add_deployment"
STOP_PERMISSION = "deployments.change_deployment"


def can_deploy(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.has_perm(DEPLOY_PERMISSION))  # type: ignore[union-attr,attr-defined]


def can_stop(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.has_perm(STOP_PERMISSION))  # type: ignore[union-attr,attr-defined]


def can_view(user: AbstractBaseUser | AnonymousUser) -> bool:
    """A viewer, operator or admin; a logged-in user with no role sees no deployment."""
    return bool(user.is_authenticated and user.has_perm(VIEW_PERMISSION))  # type: ignore[union-attr,attr-defined]
