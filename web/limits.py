"""Request bodies over the limit are refused before anything reads them: 413 with a JSON
error, never a 400 or a 500 from a parser half-way through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware


def body_refusal(request: HttpRequest) -> HttpResponse | None:
    """413 for a declared length over DATA_UPLOAD_MAX_MEMORY_SIZE, 400 for a malformed one."""
    refused = body_refusal_of(request.META.get("CONTENT_LENGTH") or "")
    return None if refused is None else JsonResponse(refused[1], status=refused[0])


def body_refusal_of(raw: str) -> tuple[int, dict[str, str]] | None:
    """body_refusal's status and JSON body for a Content-Length header's value (also the
    ASGI path's, web/fleet/asgi.py)."""
    if not raw:
        return None
    limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        return 400, {"detail": "The Content-Length header is not a byte count."}
    if limit and int(raw) > limit:
        return 413, {"detail": f"The request body is {int(raw)} bytes; the limit is {limit} "
                               "bytes (APPLIANCE_MAX_BODY_BYTES)."}
    return None


@sync_and_async_middleware
def body_limit_middleware(get_response: Callable[[HttpRequest], Any]) -> Callable[..., Any]:
    # Both kinds: a sync-only middleware would push the async SSE view through a thread.
    if iscoroutinefunction(get_response):
        async def async_middleware(request: HttpRequest) -> HttpResponse:
            refusal = body_refusal(request)
            if refusal is not None:
                return refusal
            response: Awaitable[HttpResponse] = get_response(request)
            return await response

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        refusal = body_refusal(request)
        return refusal if refusal is not None else get_response(request)

    return middleware
