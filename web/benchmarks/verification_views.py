"""Panel pages of the losslessness check: list, new (the start form), detail (live progress
polled from the REST API, the per-prompt table with both continuations side by side)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST, require_safe

from appliance.bench.lossless import NEAR_TIE_GAP
from web.deployments.permissions import can_deploy, require_view

from . import verification_selectors as selectors
from . import verification_services as services
from .verification_api import VerificationCreateSerializer, create_from
from .verification_models import VerificationRun

# Shown beside the threshold in the form and on each check's page.
THRESHOLD_WHY = (
    "At temperature 0, bf16 kernels are not batch-invariant: the same prompt gives other text "
    "even without speculation. On the real engine (SGLang 433c58ed7 on an H200, DDTREE and "
    "DFLASH against no speculation, 12 prompts of 64 tokens) every divergence sat where the "
    "baseline's top two log-probs were 0.125 or less apart (one or two bf16 steps, or an "
    f"exact tie). The default, {NEAR_TIE_GAP}, is four times that: a divergence at a gap "
    "above it is a failure (a verify that changed the output), at or under it a near-tie.")


@login_required
@require_safe
def verification_list(request: HttpRequest) -> HttpResponse:
    require_view(request.user, what="checks")
    return render(request, "benchmarks/verification_list.html", {
        "runs": selectors.verification_list()[:200], "can_run": can_deploy(request.user)})


def _form_data(request: HttpRequest) -> dict[str, object]:
    data: dict[str, object] = {k: v for k, v in request.POST.items()
                               if v != "" and k != "csrfmiddlewaretoken"}
    upload = request.FILES.get("prompts_file")
    if upload is not None:
        data["prompts"] = upload.read().decode("utf-8", errors="replace")
        data.setdefault("prompt_source", "jsonl")
    return data


@login_required
def verification_new(request: HttpRequest) -> HttpResponse:
    if not can_deploy(request.user):
        raise PermissionDenied("You need the operator role to run losslessness checks.")
    errors: dict[str, object] = {}
    # ?candidate=<id> (the deployment page's "Check losslessness") chooses A in the form.
    values: dict[str, object] = {k: v for k, v in request.GET.items()
                                 if k in ("candidate", "baseline")}
    if request.method == "POST":
        values = _form_data(request)
        body = VerificationCreateSerializer(data=values)
        if body.is_valid():
            try:
                run = create_from(body, request.user)
            except Exception as exc:  # a ValidationError naming the field
                errors = getattr(exc, "detail", {"": str(exc)})
            else:
                return redirect("benchmarks:verification-detail", pk=run.pk)
        else:
            errors = dict(body.errors)
    return render(request, "benchmarks/verification_new.html", {
        "candidates": selectors.speculative_ready(), "baselines": selectors.baseline_ready(),
        "errors": errors, "values": values, "default_threshold": NEAR_TIE_GAP,
        "default_max_tokens": services.DEFAULT_MAX_TOKENS, "threshold_why": THRESHOLD_WHY,
        "builtin_count": len(services.verification_prompts(source="builtin", text="")),
        "gateway_url": settings.GATEWAY_URL,
    }, status=400 if errors else 200)


@login_required
@require_safe
def verification_detail(request: HttpRequest, pk: int) -> HttpResponse:
    require_view(request.user, what="checks")
    run = get_object_or_404(VerificationRun, pk=pk)
    return render(request, "benchmarks/verification_detail.html", {
        "run": run, "can_cancel": can_deploy(request.user), "threshold_why": THRESHOLD_WHY})


@login_required
@require_POST
def verification_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    if not can_deploy(request.user):
        raise PermissionDenied("You need the operator role to cancel checks.")
    services.verification_request_cancel(run=get_object_or_404(VerificationRun, pk=pk))
    return redirect("benchmarks:verification-detail", pk=pk)
