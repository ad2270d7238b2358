"""The detail page's log beyond its tail: a page of history as JSON (older or newer lines,
a kind filter, a text search) and the whole log as a streamed text download. The reads are
logpane's (event_history, event_log_page); these views parse and answer."""

from __future__ import annotations

from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_safe

from . import logpane
from .forms import EventHistoryForm
from .models import Deployment
from .permissions import can_view

DOWNLOAD_PAGE = 5000  # lines per database read of a download
_NO_ROLE = "You need the viewer role (or operator) to see deployments; ask an admin."


@login_required
@require_safe
def deployment_events(request: HttpRequest, pk: int) -> HttpResponse:
    """A page of the log's history as JSON: older lines (?before=), newer (?after=), or the
    newest; of some kinds (?kind=) or containing a text (?q=)."""
    if not can_view(request.user):
        raise PermissionDenied(_NO_ROLE)
    form = EventHistoryForm(request.GET)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors_by_field()}, status=400)
    if not Deployment.objects.filter(pk=pk).exists():
        raise Http404("No such deployment.")
    q = form.cleaned_data
    page = logpane.event_history(
        deployment_id=pk, limit=q["limit"] or 200, kinds=q["kind"], text=q["q"] or "",
        before=q["before"], after=q["after"])
    return JsonResponse({"events": page.events, "next_before": page.next_before,
                         "next_after": page.next_after})


@login_required
@require_safe
async def deployment_log_download(
        request: HttpRequest, pk: int) -> HttpResponse | StreamingHttpResponse:
    """The whole log as text, streamed a keyset page at a time: never all in memory, and no
    database connection or transaction held between pages (a download may be slow)."""
    user = await request.auser()
    if not await sync_to_async(can_view)(user):
        raise PermissionDenied(_NO_ROLE)
    name = await Deployment.objects.filter(pk=pk).values_list("name", flat=True).afirst()
    if name is None:
        raise Http404("No such deployment.")
    response = StreamingHttpResponse(_log_text(pk), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}-{pk}.log"'
    return response


async def _log_text(pk: int) -> AsyncIterator[bytes]:
    after = 0
    while True:
        chunk, after = await sync_to_async(_log_chunk, thread_sensitive=False)(pk, after)
        if not chunk:
            return
        yield chunk


def _log_chunk(pk: int, after: int) -> tuple[bytes, int]:
    try:
        page = logpane.event_log_page(deployment_id=pk, after=after, limit=DOWNLOAD_PAGE)
    finally:
        connection.close()  # back to the pool between pages
    text = "".join(logpane.event_log_line(e) for e in page)
    return text.encode(), (page[-1].seq if page else after)
