"""Panel pages for a deployment's lifecycle: confirm and stop, restart, delete, and the
deployment a new-deployment form is filled from (Clone, Redeploy with the fix).

Every one works without JavaScript: Stop and Delete are a confirm page with a form.
The actions are services.py's and web/deployments/services/deployments.py's;
web/deployments/services/lifecycle.py moves the status.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from appliance.engine.recipes import RecipeError
from web.deployments import logpane, selectors, services
from web.deployments.models import TERMINAL_STATUSES, Deployment, DeploymentStatus
from web.deployments.permissions import can_delete, can_deploy, can_stop, can_view
from web.deployments.services.rolling import deployment_has_replicas

from . import services as deploying
from .clone import FilledForm, form_from_deployment


def _confirm(request: HttpRequest, deployment: Deployment, *, action: str,
             status: int = 200) -> HttpResponse:
    return render(request, "deployments/confirm.html", {
        "deployment": deployment, "action": action,
        "replica_rows": Deployment.objects.filter(replica_of=deployment).count(),
        "drain_timeout_s": settings.ROLL_DRAIN_TIMEOUT_S,
        "load_s": selectors.deployment_load_seconds(deployment=deployment)}, status=status)


@login_required
def deployment_stop(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the confirm page; POST with confirm=yes: stop (a queued one stops at once)."""
    if not can_stop(request.user):
        raise PermissionDenied("You need the operator role to stop deployments.")
    deployment = get_object_or_404(Deployment, pk=pk)
    if request.method != "POST" or request.POST.get("confirm") != "yes":
        return _confirm(request, deployment, action="stop")
    deployment = services.deployment_stop(deployment_id=deployment.pk)
    verb = "Stopped" if deployment.status == DeploymentStatus.STOPPED else "Stopping"
    messages.info(request, f"{verb} {deployment.name}.",
                  extra_tags=f"while-{deployment.status}")
    return redirect("deployments:detail", pk=pk)


def _flash_refusal(request: HttpRequest, action: str,
                   exc: services.DeploymentInputError) -> None:
    """Each field's refusal as a flash on the page the action came from."""
    for field, texts in exc.errors.items():
        for text in texts:
            messages.error(request, f"{action} refused ({field}): {text}")


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def deployment_restart(request: HttpRequest, pk: int) -> HttpResponse:
    """A stopped or failed deployment: POST restarts it. One with replicas (a rolling
    restart, each replica drained and started again in turn): GET is its confirm page, and
    only POST with confirm=yes rolls."""
    if not can_stop(request.user):
        raise PermissionDenied("You need the operator role to restart deployments.")
    deployment = get_object_or_404(Deployment, pk=pk)
    rolls = deployment_has_replicas(deployment=deployment)
    if request.method != "POST" or (rolls and request.POST.get("confirm") != "yes"):
        if not rolls:
            return redirect("deployments:detail", pk=pk)
        return _confirm(request, deployment, action="restart")
    try:
        deployment = services.deployment_restart(deployment_id=pk, user=request.user)
    except services.DeploymentInputError as exc:
        _flash_refusal(request, "Restart", exc)
        return redirect("deployments:detail", pk=pk)
    if (deployment.rolling or {}).get("state") == "rolling":
        messages.success(request, f"{deployment.name}: {deployment.rolling['text']}.")
    else:
        messages.success(request, f"Restarted {deployment.name}: run {deployment.run} queued.",
                         extra_tags=f"while-{deployment.status}")
    return redirect("deployments:detail", pk=pk)


@login_required
@require_POST
def deployment_scale(request: HttpRequest, pk: int) -> HttpResponse:
    """The page's Scale form: run this many replicas (Restart's permission)."""
    if not can_stop(request.user):
        raise PermissionDenied("You need the operator role to scale deployments.")
    get_object_or_404(Deployment, pk=pk)
    before = _running_indexes(pk)
    raw = request.POST.get("replicas", "").strip()
    if not raw.isdigit():
        messages.error(request, f"Scale refused (replicas): write a whole number of replicas "
                       f"from 1 to 128, not {raw[:20]!r}.")
        return redirect("deployments:detail", pk=pk)
    try:
        deployment = deploying.deployment_scale(deployment_id=pk, replicas=int(raw),
                                                user=request.user)
    except services.DeploymentInputError as exc:
        _flash_refusal(request, "Scale", exc)
        return redirect("deployments:detail", pk=pk)
    messages.success(request, _scaled_text(deployment.name, before, int(raw)))
    return redirect("deployments:detail", pk=pk)


def _running_indexes(pk: int) -> list[int]:
    """The replica indexes of a deployment's rows that run (not stopped or failed)."""
    return sorted(Deployment.objects.filter(Q(pk=pk) | Q(replica_of_id=pk))
                  .exclude(status__in=list(TERMINAL_STATUSES))
                  .values_list("replica_index", flat=True))


def _scaled_text(name: str, before: list[int], replicas: int) -> str:
    """What a Scale did, in the words the page's Replicas header then agrees with: the count,
    and the rows that start or stop to get there."""
    was = len(before)
    count = f"{replicas} replica{'s' if replicas != 1 else ''}"
    if was == replicas:
        return f"{name} runs {count} already."
    if replicas < was:
        gone = [i for i in before if i >= replicas]
        return (f"Scaled {name} from {was} to {count}: replica{'s' if len(gone) != 1 else ''} "
                f"{', '.join(map(str, gone))} stopping.")
    new = [i for i in range(replicas) if i not in before]
    return (f"Scaled {name} from {was} to {count}: replica{'s' if len(new) != 1 else ''} "
            f"{', '.join(map(str, new))} starting.")


@login_required
def deployment_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the confirm page; POST with confirm=yes: delete with its events and series."""
    if not can_delete(request.user):
        raise PermissionDenied("You need the operator role to delete deployments.")
    deployment = get_object_or_404(Deployment, pk=pk)
    if request.method != "POST" or request.POST.get("confirm") != "yes":
        return _confirm(request, deployment, action="delete")
    try:
        services.deployment_delete(deployment_id=pk)
    except services.DeploymentInputError as exc:
        for texts in exc.errors.values():
            for text in texts:
                messages.error(request, text)
        return redirect("deployments:detail", pk=pk)
    messages.success(request, f"Deleted {deployment.name} (#{pk}) with its log and metrics.")
    return redirect("deployments:list")


def form_source(request: HttpRequest) -> FilledForm | None:
    """The deployment a new form is filled from (?from=<id>), with its diagnosis' fix
    applied when asked (&fix=1); None without ?from=."""
    raw = request.GET.get("from")
    if raw is None:
        return None
    if not raw.isdigit() or not (can_view(request.user) and can_deploy(request.user)):
        raise Http404("No such deployment to start from.")
    deployment = get_object_or_404(Deployment, pk=int(raw))
    patch = (deployment.diagnosis or {}).get("patch") if request.GET.get("fix") == "1" else None
    try:
        defaults = services.recipe_load(deployment.recipe).engine_defaults
    except (RecipeError, ValueError):
        defaults = {}  # the recipe is gone or broken: the form says so when deploying
    return form_from_deployment(deployment.spec, engine_defaults=defaults, patch=patch)


RUN_LOG_PAGE = 5000  # lines per database read of a run's log


@login_required
@require_safe
def deployment_run_log(request: HttpRequest, pk: int, number: int) -> StreamingHttpResponse:
    """One run's lines as text (its seqs first..last), a keyset page at a time."""
    if not can_view(request.user):
        raise PermissionDenied("You need the viewer role (or operator) to see deployments.")
    deployment = get_object_or_404(Deployment, pk=pk)
    run = next((r for r in selectors.deployment_runs(deployment=deployment)
                if r["number"] == number), None)
    if run is None:
        raise Http404(f"{deployment.name} has no run {number}.")
    response = StreamingHttpResponse(_run_lines(pk, run["first_seq"], run["last_seq"]),
                                     content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="{deployment.name}-{pk}-run{number}.log"')
    return response


def _run_lines(pk: int, first: int, last: int) -> Iterator[bytes]:
    after = first - 1
    while after < last:
        page = [e for e in logpane.event_log_page(deployment_id=pk, after=after,
                                                    limit=RUN_LOG_PAGE) if e.seq <= last]
        if not page:
            return
        yield "".join(logpane.event_log_line(e) for e in page).encode()
        after = page[-1].seq
