"""Panel pages of the model store: the list (with the add form and a scan) and an entry's
page, whose progress follows the entry's event stream (web/store/sse.py)."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from rest_framework.exceptions import ValidationError

from web.deployments.permissions import can_deploy, can_view

from . import selectors, services
from .api import entry_add
from .models import ModelEntry


def _require(request: HttpRequest, *, operate: bool = False) -> None:
    if operate and not can_deploy(request.user):
        raise PermissionDenied("You need the operator role to add, cancel or scan models.")
    if not can_view(request.user):
        raise PermissionDenied("You need the viewer role (or operator) to see the model store.")


def _list(request: HttpRequest, *, errors: dict[str, object], form: dict[str, str],
          status: int = 200) -> HttpResponse:
    entries = list(selectors.model_entries_list())
    using = {e.pk: list(selectors.model_entry_deployments(entry=e)) for e in entries}
    return render(request, "store/list.html", {
        "entries": [(e, using[e.pk]) for e in entries], "roots": settings.MODEL_ROOTS,
        "can_operate": can_deploy(request.user), "errors": errors, "form": form,
    }, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def model_list(request: HttpRequest) -> HttpResponse:
    """GET: the store; POST: add a model from the hub (form errors by field, a 400)."""
    if request.method != "POST":
        _require(request)
        return _list(request, errors={}, form={"revision": "main"})
    _require(request, operate=True)
    form = {k: request.POST.get(k, "").strip() for k in ("repo_id", "revision", "root", "path")}
    try:
        entry = entry_add({k: v for k, v in form.items() if v})
    except ValidationError as exc:
        detail = exc.detail if isinstance(exc.detail, dict) else {"": exc.detail}
        return _list(request, errors=dict(detail), form=form, status=400)
    return redirect("store:detail", pk=entry.pk)


@login_required
@require_safe
def model_detail(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request)
    entry = get_object_or_404(ModelEntry, pk=pk)
    return render(request, "store/detail.html", {
        "entry": entry, "files": list(entry.files.all()),
        "config_json": json.dumps(entry.config, sort_keys=True),
        "deployments": list(selectors.model_entry_deployments(entry=entry)),
        "can_operate": can_deploy(request.user)})


@login_required
@require_POST
def model_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, operate=True)
    services.model_download_cancel(entry_id=get_object_or_404(ModelEntry, pk=pk).pk)
    return redirect("store:detail", pk=pk)


@login_required
@require_POST
def model_scan(request: HttpRequest) -> HttpResponse:
    _require(request, operate=True)
    services.model_store_scan()
    return redirect("store:list")
