"""Who is calling and what they may reach. The database reads here are sync (the proxy runs
them on a thread, and caches their answers: web/gateway/routing.py); the rules are plain.

A request is let in by an API key (`Authorization: Bearer sk-sd-...`) or by a logged-in
panel session of an operator or admin (the session cookie and, for a POST, Django's CSRF
check: the `X-CSRFToken` header), as the playground calls it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user, get_user_model
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware

from web.deployments.models import TERMINAL_STATUSES, DeploymentStatus
from web.deployments.permissions import can_deploy
from web.gateway.selectors import (
    KeyGrant,
    Target,
    gateway_ended_target,
    gateway_heartbeats,
    gateway_targets,
    key_grant,
)


@dataclass(frozen=True)
class Refusal:
    """An OpenAI-shaped error: status, message, type, code (and Retry-After for 429)."""

    status: int
    message: str
    type: str
    code: str
    param: str | None = None
    retry_after: int | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code,
                          "param": self.param}}


@dataclass(frozen=True)
class Caller:
    """An admitted caller: a key (key set) or an operator's session (key None)."""

    user_id: int
    key: KeyGrant | None = None

    def allows(self, deployment_id: int) -> bool:
        return self.key is None or self.key.allows(deployment_id)


NO_CREDENTIALS = Refusal(401, "No API key: send `Authorization: Bearer sk-sd-...` (make a key "
                         "in the panel under API keys, or with `manage.py apikey create`).",
                         "authentication_error", "missing_api_key")
BAD_KEY = Refusal(401, "The API key is not valid: check it was copied whole; a key is shown "
                  "only once, when it is made.", "authentication_error", "invalid_api_key")


def _unused_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse()  # CsrfViewMiddleware.process_view needs a (non-exempt) view


def _session_caller(scope: dict[str, Any]) -> Caller | Refusal:
    """The operator behind a session cookie, with Django's own CSRF check for a POST."""
    request = ASGIRequest(scope, io.BytesIO())
    session_key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return NO_CREDENTIALS
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(request)
    if not user.is_authenticated:
        return NO_CREDENTIALS
    refused = CsrfViewMiddleware(_unused_view).process_view(request, _unused_view, (), {})
    if refused is not None:
        return Refusal(403, "A panel session must send the CSRF token (the X-CSRFToken "
                       "header, from the csrftoken cookie).", "permission_error",
                       "csrf_failed")
    if not can_deploy(user):
        return Refusal(403, f"{user} may not call deployments: that takes the operator or "
                       "admin role.", "permission_error", "role_required")
    return Caller(user_id=int(user.pk))


def key_caller(*, secret: str) -> Caller | Refusal:
    """The caller a key is: its owner must still be an active operator or admin."""
    try:
        grant = key_grant(secret=secret)
        if grant is None:
            return BAD_KEY
        if grant.revoked:
            return Refusal(403, "This API key was revoked; make a new one in the panel.",
                           "permission_error", "key_revoked")
        owner = get_user_model().objects.filter(pk=grant.owner_id, is_active=True).first()
        if owner is None or not can_deploy(owner):
            return Refusal(403, "This API key's owner may no longer call deployments (the "
                           "operator role is needed).", "permission_error", "role_required")
        return Caller(user_id=grant.owner_id, key=grant)
    finally:
        connection.close()  # off Django's request cycle: hand the connection back


def target_for(*, caller: Caller, model: str, targets: list[Target]) -> Target | Refusal:
    """The deployment serving `model` among the routed ones, if the caller may reach it: a
    ready one first (the newest), else any active one (503: not ready yet), else 404."""
    named = [t for t in targets if t.model == model]
    # (One active deployment a name since services/served_names.py; two from before it: the
    # one this caller may call, as /v1/models lists it.)
    # A key's scope names replica 0 (the deployment people see): its replicas are in it.
    candidates = ([t for t in named if t.ready and caller.allows(t.group_id)]
                  or [t for t in named if t.ready] or named)
    target = candidates[0] if candidates else None
    if target is None:
        return Refusal(404, f"No deployment serves the model {model!r}: GET /v1/models lists "
                       "those you may call.", "invalid_request_error", "model_not_found",
                       param="model")
    if not caller.allows(target.group_id):
        return Refusal(403, f"This API key may not call {model!r}: its scope names other "
                       "deployments.", "permission_error", "model_not_allowed", param="model")
    if not target.ready:
        return not_ready(target)
    return target


def not_ready(target: Target) -> Refusal:
    """503 for a deployment that exists but does not serve now, naming its status."""
    model, status = target.model, target.status
    if status in TERMINAL_STATUSES:
        advice = ("its engine is not running: restart the deployment in the panel (its page "
                  "says why it ended), or call another model")
    elif status == DeploymentStatus.READY:  # ready without an engine URL: being adopted
        advice = "its engine's address is not known yet; try again shortly"
    else:
        advice = "try again when it is ready"
    return Refusal(503, f"The deployment serving {model!r} (#{target.deployment_id}) is "
                   f"{status}, not ready: {advice}.", "service_unavailable",
                   "deployment_not_ready")


def session_caller(*, scope: dict[str, Any]) -> Caller | Refusal:
    try:
        return _session_caller(scope)
    finally:
        connection.close()


def ended_route(*, model: str) -> Target | None:
    """The newest ended deployment that served `model` (selectors.gateway_ended_target)."""
    try:
        return gateway_ended_target(model=model)
    finally:
        connection.close()


def routes() -> list[Target]:
    """Every active deployment as the gateway routes to it (selectors.gateway_targets)."""
    try:
        return gateway_targets()
    finally:
        connection.close()


def routes_and_heartbeats() -> tuple[list[Target], dict[str, float]]:
    """The routing table and each host's last heartbeat, on one connection."""
    try:
        return gateway_targets(), gateway_heartbeats()
    finally:
        connection.close()


def models_for(*, caller: Caller, targets: list[Target]) -> list[Target]:
    """The ready deployments a caller may call, one entry per served model name."""
    seen: dict[str, Target] = {}
    for target in targets:
        if target.ready and caller.allows(target.group_id):
            seen.setdefault(target.model, target)
    return list(seen.values())
