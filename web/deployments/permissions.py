"""Who may do what. Named actors: a viewer reads, an operator deploys, stops, restarts and
deletes ended deployments, an admin all.

Roles are Django permissions on the Deployment model, so new roles are groups, not code.
A request made with an API token scoped to a role (web.accounts) has at most that role's
permissions, and never more than its user's.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied

VIEW_PERMISSION = "deployments.view_deployment"
DEPLOY_PERMISSION = "deployments.add_deployment"
STOP_PERMISSION = "deployments.change_deployment"
DELETE_PERMISSION = "deployments.delete_deployment"


# What each role a token can be scoped to grants.
ROLE_PERMISSIONS = {
    "viewer": frozenset({VIEW_PERMISSION}),
    "operator": frozenset({VIEW_PERMISSION, DEPLOY_PERMISSION, STOP_PERMISSION,
                           DELETE_PERMISSION}),
}


def _has(user: AbstractBaseUser | AnonymousUser, permission: str) -> bool:
    if not (user.is_authenticated and user.has_perm(permission)):  # type: ignore[union-attr,attr-defined]
        return False
    # Set by web.accounts.auth for a scoped token; a session has none.
    role = getattr(user, "token_role", None)
    return role is None or permission in ROLE_PERMISSIONS[role]


def can_deploy(user: AbstractBaseUser | AnonymousUser) -> bool:
    return _has(user, DEPLOY_PERMISSION)


def can_stop(user: AbstractBaseUser | AnonymousUser) -> bool:
    return _has(user, STOP_PERMISSION)


def can_delete(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Delete a stopped or failed deployment with its log (an operator's, an admin's)."""
    return _has(user, DELETE_PERMISSION)


def can_view(user: AbstractBaseUser | AnonymousUser) -> bool:
    """A viewer, operator or admin; a logged-in user with no role sees no deployment."""
    return _has(user, VIEW_PERMISSION)


def require_view(user: AbstractBaseUser | AnonymousUser, *, what: str) -> None:
    """PermissionDenied (403, its page says why) for a user who may not see `what`."""
    if not can_view(user):
        raise PermissionDenied(f"You need the viewer role (or operator) to see {what}.")


def roles_of(user: AbstractBaseUser | AnonymousUser) -> list[str]:
    """The roles a token of this user may be scoped to: those whose permissions it holds."""
    if not user.is_authenticated:
        return []
    return [role for role, perms in ROLE_PERMISSIONS.items()
            if all(user.has_perm(p) for p in perms)]  # type: ignore[union-attr,attr-defined]
