"""Waiting on a deployment row: its status, polled from the database with a bound."""

from __future__ import annotations

import time

from web.deployments.models import Deployment


def wait_for_status(pk: int, statuses: set[str], timeout_s: float) -> str:
    """Poll a deployment's status until it is one of `statuses` or `timeout_s` has passed;
    the status last read either way (the caller asserts which it wanted)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = Deployment.objects.values_list("status", flat=True).get(pk=pk)
        if status in statuses or time.monotonic() > deadline:
            return str(status)
        time.sleep(0.2)
