"""Panel pages: list, new, detail (progress polled from the REST API, charts, table)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST, require_safe

from appliance.bench.prompts import SOURCES
from appliance.bench.runner import DEFAULT_LEVELS, MODES
from web.deployments.permissions import can_deploy, require_view

from . import selectors, services
from .api import BenchmarkCreateSerializer, create_from
from .models import BenchmarkRun


@login_required
@require_safe
def benchmark_list(request: HttpRequest) -> HttpResponse:
    require_view(request.user, what="benchmarks")
    return render(request, "benchmarks/list.html", {
        "runs": selectors.benchmark_list()[:200], "can_run": can_deploy(request.user)})


def _form_data(request: HttpRequest) -> dict[str, object]:
    post = request.POST
    upload = request.FILES.get("prompts_file")
    data: dict[str, object] = {k: v for k, v in post.items() if v != "" and k not in (
        "csrfmiddlewaretoken", "deployments", "levels")}
    data["deployments"] = post.getlist("deployments")
    data["levels"] = [x.strip() for x in post.get("levels", "").split(",") if x.strip()]
    if upload is not None:
        data["prompts"] = upload.read().decode("utf-8", errors="replace")
    return data


@login_required
def benchmark_new(request: HttpRequest) -> HttpResponse:
    if not can_deploy(request.user):
        raise PermissionDenied("You need the operator role to run benchmarks.")
    errors: dict[str, object] = {}
    if request.method == "POST":
        body = BenchmarkCreateSerializer(data=_form_data(request))
        if body.is_valid():
            try:
                run = create_from(body, request.user)
            except Exception as exc:  # a ValidationError naming the field
                errors = getattr(exc, "detail", {"": str(exc)})
            else:
                return redirect("benchmarks:detail", pk=run.pk)
        else:
            errors = dict(body.errors)
    return render(request, "benchmarks/new.html", {
        "deployments": selectors.ready_deployments(), "errors": errors,
        "levels": ",".join(map(str, DEFAULT_LEVELS)), "sources": SOURCES, "modes": MODES,
    }, status=400 if errors else 200)


@login_required
@require_safe
def benchmark_detail(request: HttpRequest, pk: int) -> HttpResponse:
    require_view(request.user, what="benchmarks")
    run = get_object_or_404(BenchmarkRun, pk=pk)
    return render(request, "benchmarks/detail.html", {
        "run": run, "can_cancel": can_deploy(request.user)})


@login_required
@require_POST
def benchmark_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    if not can_deploy(request.user):
        raise PermissionDenied("You need the operator role to cancel benchmarks.")
    services.benchmark_request_cancel(run=get_object_or_404(BenchmarkRun, pk=pk))
    return redirect("benchmarks:detail", pk=pk)
