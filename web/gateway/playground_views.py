"""How to call a deployment (a section of its detail page) and the playground page: a chat
with a ready deployment through the gateway's own URLs, with the panel session as the key.

Where and as what a deployment is served and which keys may call it are the gateway's own
facts (selectors.py); these views put them on the page.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_safe

from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.permissions import can_deploy
from web.deployments.services.served_names import served_model_name

from .howto import KEY_VAR, curl_example, python_example
from .selectors import api_keys_for_deployment, gateway_base_url

# The playground's inputs start here; the engine's own limits still apply.
DEFAULT_MAX_TOKENS = 256
MAX_TOKENS_LIMIT = 32768


def how_to_call(*, request: HttpRequest, deployment: Deployment) -> dict[str, Any]:
    """The detail page's "How to call it": base URL, model name, examples with the key
    elided and which of this user's keys may call it. Rendered whatever the status (the
    page shows the examples once its live status turns ready)."""
    base_url = gateway_base_url(request=request)
    model = served_model_name(deployment=deployment)
    return {
        "ready": deployment.status == DeploymentStatus.READY,
        "base_url": base_url,
        "model": model,
        "key_var": KEY_VAR,
        "curl": curl_example(base_url=base_url, model=model),
        "python": python_example(base_url=base_url, model=model),
        "keys": api_keys_for_deployment(user=request.user, deployment=deployment),
    }


@login_required
@require_safe
def deployment_playground(request: HttpRequest, pk: int) -> HttpResponse:
    # The playground calls the gateway with the session, which the gateway lets an operator
    # (or above) do: a viewer would get 403 on every message, so the page says so up front.
    if not can_deploy(request.user):
        raise PermissionDenied("The playground needs the operator role: ask an admin, or "
                               "call the deployment with an API key (see its page).")
    deployment = get_object_or_404(Deployment, pk=pk)
    base_url = gateway_base_url(request=request)
    return render(request, "deployments/playground.html", {
        "deployment": deployment,
        "ready": deployment.status == DeploymentStatus.READY,
        "base_url": base_url,
        "model": served_model_name(deployment=deployment),
        "speculative": deployment.algorithm not in ("", "NONE"),
        "summary_url": reverse("deployment-summary", args=[deployment.pk]),
        "default_max_tokens": DEFAULT_MAX_TOKENS,
        "max_tokens_limit": MAX_TOKENS_LIMIT,
        "key_var": KEY_VAR,
    })
