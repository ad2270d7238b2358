"""{% root_read_rates %}: each model root's measured read rate, for the store page."""

from __future__ import annotations

from typing import Any

from django import template

from web.deployments.permissions import can_deploy

from ..loadtime import root_read_rates_list

register = template.Library()


@register.inclusion_tag("deployments/_read_rates.html", takes_context=True)
def root_read_rates(context: dict[str, Any]) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    return {"rates": root_read_rates_list(), "request": request,
            "can_measure": user is not None and can_deploy(user),
            "csrf_token": context.get("csrf_token")}
