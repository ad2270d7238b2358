"""Deployment rows made through the product's own services, in the states tests start from
(tests/specs.py stays free of Django; this module is its database side)."""

from __future__ import annotations

from typing import Any

from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import Deployment


def queued(**changes: Any) -> Deployment:
    """A deployment as the form makes it: queued, warnings confirmed."""
    return deploying.deployment_create(data=spec(**changes), confirm_warnings=True)


def ready(**changes: Any) -> Deployment:
    """A deployment its agent has started and found ready."""
    made = queued(**changes)
    services.deployment_mark_starting(deployment_id=made.pk, image="img", start_token="t")
    services.deployment_mark_ready(deployment_id=made.pk)
    return Deployment.objects.get(pk=made.pk)
