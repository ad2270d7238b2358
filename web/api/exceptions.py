"""API errors as JSON: field errors for bad input, never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from web.deployments.services import DeploymentInputError

log = logging.getLogger(__name__)


def input_error_response(exc: DeploymentInputError) -> Response:
    body: dict[str, Any] = dict(exc.errors)
    if exc.findings:
        body["preflight"] = [f.to_dict() for f in exc.findings]
        if exc.host:
            body["preflight_host"] = exc.host  # the host (or hosts) they were checked on
    if exc.needs_confirmation:
        body["needs_confirmation"] = True
    return Response(body, status=status.HTTP_400_BAD_REQUEST)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DeploymentInputError):
        return input_error_response(exc)
    if isinstance(exc, RequestDataTooBig):
        # web/limits.py answers a declared length first; this is a body that grew past it.
        return Response({"detail": "The request body is over the limit "
                                   "(APPLIANCE_MAX_BODY_BYTES)."},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, TooManyFieldsSent):
        return Response({"detail": "The request has too many form fields."},
                        status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is None:
        # A bug: logged with its traceback on the server, never shown to the client.
        log.exception("unhandled API error", exc_info=exc)
        return Response(
            {"detail": "Internal error; it has been logged. Try again or check the server log."},
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    return response
