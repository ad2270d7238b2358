"""Live progress of one store entry as server-sent events, under ASGI.

An entry's progress is a state, not a log: each frame is the whole entry (bytes done and
total, per file, rate, time left, state) as the REST API gives it, sent when it changed, so
a client that reconnects simply gets the present. The job writes the rows every
STORE_PROGRESS_MS; the stream reads them at the same pace, on a worker thread that hands
its connection back before the next wait, and ends after the entry's terminal frame.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_safe

from web.deployments.permissions import can_view

from .api import ModelEntryDetailSerializer
from .models import TERMINAL_STATES, ModelEntry

KEEPALIVE = b": keep-alive\n\n"


def _snapshot(pk: int) -> dict[str, Any] | None:
    try:
        entry = ModelEntry.objects.filter(pk=pk).prefetch_related("files").first()
        return None if entry is None else dict(ModelEntryDetailSerializer(entry).data)
    finally:
        connection.close()


def _refusal(request: HttpRequest, pk: int) -> HttpResponse | None:
    try:
        if not request.user.is_authenticated:
            return HttpResponse("Log in to follow a download.", status=401,
                                content_type="text/plain")
        if not can_view(request.user):
            return HttpResponse("You need the viewer role to follow a download.", status=403,
                                content_type="text/plain")
        if not ModelEntry.objects.filter(pk=pk).exists():
            return HttpResponse("No such model in the store.", status=404,
                                content_type="text/plain")
        return None
    finally:
        connection.close()


def frame(snapshot: dict[str, Any], seq: int) -> bytes:
    data = json.dumps(snapshot, default=str, separators=(",", ":"))
    return f"id: {seq}\nevent: progress\ndata: {data}\n\n".encode()


async def _frames(pk: int) -> AsyncIterator[bytes]:
    last, seq, quiet_since = None, 0, time.monotonic()
    pace = max(settings.STORE_PROGRESS_MS, 100) / 1000
    while True:
        snapshot = await sync_to_async(_snapshot, thread_sensitive=False)(pk)
        if snapshot is None:
            return  # deleted while followed
        if snapshot != last:
            seq, last, quiet_since = seq + 1, snapshot, time.monotonic()
            yield frame(snapshot, seq)
            if snapshot["state"] in TERMINAL_STATES:
                return
        elif time.monotonic() - quiet_since >= settings.SSE_KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield KEEPALIVE
        await asyncio.sleep(pace)


@require_safe
async def model_entry_stream(request: HttpRequest, pk: int
                             ) -> HttpResponse | StreamingHttpResponse:
    refusal = await sync_to_async(_refusal)(request, pk)
    if refusal is not None:
        return refusal
    response = StreamingHttpResponse(_frames(pk), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
