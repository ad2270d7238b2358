"""The logged-in user's API tokens: made (shown once, on the page that made it), listed
with their role, revoked. Only one's own; a role no larger than one's own."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from web.accounts import tokens
from web.deployments.permissions import roles_of


class TokenForm(forms.Form):
    role = forms.ChoiceField(choices=())
    days = forms.IntegerField(min_value=0, max_value=3650, required=False,
                              help_text="Expires after this many days; 0 never; empty: "
                                        "the appliance's default.")

    def __init__(self, *args: object, roles: list[str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["role"].choices = [(r, r) for r in roles]  # type: ignore[attr-defined]


def _page(request: HttpRequest, form: TokenForm, shown: str | None = None,
          status: int = 200) -> HttpResponse:
    rows = tokens.token_list(username=request.user.get_username())
    return render(request, "accounts/tokens.html",
                  {"form": form, "tokens": rows, "shown": shown,
                   "can_make": bool(form.fields["role"].choices)},  # type: ignore[attr-defined]
                  status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def token_page(request: HttpRequest) -> HttpResponse:
    # Without a role one still sees (and revokes) tokens made before it was taken away.
    roles = roles_of(request.user)
    if request.method != "POST":
        return _page(request, TokenForm(roles=roles))
    if not roles:
        return HttpResponse("You need a role (viewer or operator) to make API tokens.",
                            status=403, content_type="text/plain")
    form = TokenForm(request.POST, roles=roles)
    if not form.is_valid():
        return _page(request, form, status=400)
    _, token = tokens.token_create(username=request.user.get_username(),
                                   role=form.cleaned_data["role"],
                                   ttl_days=form.cleaned_data["days"])
    # Rendered, not redirected: the token is on this one answer and nowhere after it.
    return _page(request, TokenForm(roles=roles), shown=token)


@login_required
@require_POST
def token_revoke(request: HttpRequest, key: str) -> HttpResponse:
    if tokens.token_revoke(key=key, username=request.user.get_username()):
        messages.success(request, f"Token {key} revoked.")
    else:
        messages.error(request, f"You have no token {key}.")
    return redirect("accounts:tokens")
