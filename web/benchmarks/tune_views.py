"""Panel pages for Tune (operators): list, new (from a deployment), detail (live progress,
the table, the chart, the recommendation, Apply, exports), cancel, apply."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST, require_safe

from appliance.tune import default_candidates
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.permissions import can_deploy

from . import tune_applying
from . import tune_selectors as selectors
from . import tune_services as services
from .services import BenchmarkInputError
from .tune_api import TuneCreateSerializer, create_from
from .tune_models import TuneRun


def _operator(request: HttpRequest) -> None:
    if not can_deploy(request.user):
        raise PermissionDenied("Tune is for operators: it takes a deployment out of service "
                               "while it runs.")


@login_required
@require_safe
def tune_list(request: HttpRequest) -> HttpResponse:
    _operator(request)
    return render(request, "benchmarks/tune_list.html", {"runs": selectors.tune_list()[:200]})


def _form_data(request: HttpRequest) -> dict[str, object]:
    post = request.POST
    data: dict[str, object] = {k: v for k, v in post.items() if v != "" and k not in (
        "csrfmiddlewaretoken", "levels", "candidates", "extra_candidates")}
    data["levels"] = [x.strip() for x in post.get("levels", "").split(",") if x.strip()]
    data["candidates"] = post.getlist("candidates")
    extra = post.get("extra_candidates", "").strip()
    if extra:
        try:
            data["extra_candidates"] = json.loads(extra)
        except json.JSONDecodeError:
            data["extra_candidates"] = "not JSON"
    upload = request.FILES.get("prompts_file")
    if upload is not None:
        data["prompts"] = upload.read().decode("utf-8", errors="replace")
    return data


@login_required
def tune_new(request: HttpRequest) -> HttpResponse:
    _operator(request)
    errors: dict[str, object] = {}
    if request.method == "POST":
        body = TuneCreateSerializer(data=_form_data(request))
        if body.is_valid():
            try:
                run = create_from(body, request.user, None)
            except Exception as exc:  # a ValidationError naming the field
                errors = getattr(exc, "detail", {"": str(exc)})
            else:
                return redirect("benchmarks:tune-detail", pk=run.pk)
        else:
            errors = dict(body.errors)
    ready = Deployment.objects.filter(status=DeploymentStatus.READY, replica_of=None).exclude(
        engine_url="").order_by("-created_at")
    chosen = request.GET.get("deployment") or request.POST.get("deployment") or ""
    first = next((d for d in ready if str(d.pk) == chosen), ready.first())
    names = [c.name for c in default_candidates(first.engine_options if first else {})]
    return render(request, "benchmarks/tune_new.html", {
        "deployments": ready, "chosen": str(first.pk) if first else "", "errors": errors,
        "candidates": names, "defaults": services.DEFAULTS,
        "levels": ",".join(map(str, services.DEFAULTS["levels"])),
        "sources": services.PROMPT_SOURCES}, status=400 if errors else 200)


@login_required
@require_safe
def tune_detail(request: HttpRequest, pk: int) -> HttpResponse:
    _operator(request)
    run = get_object_or_404(TuneRun, pk=pk)
    return render(request, "benchmarks/tune_detail.html", {"run": run})


@login_required
@require_POST
def tune_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    _operator(request)
    services.tune_request_cancel(run=get_object_or_404(TuneRun, pk=pk))
    return redirect("benchmarks:tune-detail", pk=pk)


@login_required
@require_POST
def tune_apply(request: HttpRequest, pk: int) -> HttpResponse:
    _operator(request)
    run = get_object_or_404(TuneRun, pk=pk)
    try:
        tune_applying.tune_apply(run=run, candidate=request.POST.get("candidate") or None,
                            user=request.user)
    except BenchmarkInputError as exc:
        return render(request, "benchmarks/tune_detail.html", {
            "run": run, "apply_errors": exc.errors}, status=400)
    return redirect("benchmarks:tune-detail", pk=pk)
