"""The store page's Measure button: queue a root's read-rate measurement (loadtime.py)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from web.deployments.permissions import can_deploy

from .loadtime import root_read_rate_request


@login_required
@require_POST
def root_read_rate(request: HttpRequest) -> HttpResponse:
    if not can_deploy(request.user):
        raise PermissionDenied("You need the operator role to measure a disk.")
    root = request.POST.get("root", "")
    try:
        root_read_rate_request(root=root)
    except ValueError as exc:
        messages.error(request, f"root: {exc}. Pick one of the roots listed.")
    else:
        messages.success(request, f"Measuring the read rate of {root}: reload in a few seconds.")
    return redirect("store:list")
