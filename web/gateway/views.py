"""The panel's API keys page: make a key (its secret shown once, on the answer that made
it), list one's keys with scope and usage, revoke. Operators and admins (an admin sees
everyone's)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from web.deployments.models import ACTIVE_STATUSES, Deployment
from web.deployments.permissions import can_deploy
from web.deployments.services.served_names import served_model_name
from web.gateway import selectors, services


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=services.MAX_NAME,
                           help_text="What the key is for, e.g. ci-evals.")
    deployments = forms.ModelMultipleChoiceField(
        queryset=Deployment.objects.none(), required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every deployment, now and later.")
    rate_limit_per_minute = forms.IntegerField(
        min_value=1, max_value=services.MAX_RATE_LIMIT, required=False,
        label="Rate limit (requests per minute)", help_text="Empty: no limit.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Each deployment once: replica 0, the row a key's scope names (it covers the
        # deployment's replica rows, which the gateway routes to under the same name).
        running = Q(replica_rows__status__in=list(ACTIVE_STATUSES))
        self.fields["deployments"].queryset = (  # type: ignore[attr-defined]
            Deployment.objects.filter(status__in=ACTIVE_STATUSES, replica_of=None)
            .annotate(replica_count=Count("replica_rows", filter=running) + 1)
            .order_by("name", "id"))
        self.fields["deployments"].label_from_instance = (  # type: ignore[attr-defined]
            lambda d: f"{served_model_name(deployment=d)} (#{d.pk}, {d.status}"
                      + (f", {d.replica_count} replicas)" if d.replica_count > 1 else ")"))


def _owner(request: HttpRequest) -> Any:
    return None if request.user.is_superuser else request.user  # type: ignore[union-attr]


def _page(request: HttpRequest, form: ApiKeyForm, shown: str | None = None,
          status: int = 200) -> HttpResponse:
    return render(request, "gateway/keys.html", {
        "form": form, "keys": selectors.apikey_list(owner=_owner(request)), "shown": shown,
        "base_url": selectors.gateway_base_url(request=request)}, status=status)


def _operator_only(request: HttpRequest) -> HttpResponse | None:
    if can_deploy(request.user):
        return None
    return HttpResponse("API keys call deployments: that takes the operator or admin role.",
                        status=403, content_type="text/plain")


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def keys_page(request: HttpRequest) -> HttpResponse:
    refused = _operator_only(request)
    if refused is not None:
        return refused
    if request.method != "POST":
        return _page(request, ApiKeyForm())
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    picked = form.cleaned_data["deployments"]
    try:
        made = services.apikey_create(
            owner_username=request.user.get_username(), name=form.cleaned_data["name"],
            deployment_ids=[d.pk for d in picked] if picked else None,
            rate_limit_per_minute=form.cleaned_data["rate_limit_per_minute"])
    except services.ApiKeyError as exc:
        form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        return _page(request, form, status=400)
    # Rendered, not redirected: the secret is on this one answer and nowhere after it.
    return _page(request, ApiKeyForm(), shown=made.secret)


@login_required
@require_POST
def key_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    refused = _operator_only(request)
    if refused is not None:
        return refused
    owner = _owner(request)
    if services.apikey_revoke(prefix=prefix,
                              owner_username=owner.get_username() if owner else None):
        messages.success(request, f"Key {prefix} revoked: it stops working at once.")
    else:
        messages.error(request, f"You have no active key {prefix}.")
    return redirect("gateway:keys")
