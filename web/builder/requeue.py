"""Builds that no live worker holds, sent to the workers again (the panel loop, web/loop.py,
every tick).

A build worker holds its deployment's build under a lease (`build_owner`,
`build_lease_until`: builds.py renews it while it works). A lease that ran out means its
worker died; a deployment queued long ago that no worker took had its message lost (with a
broker's data). Both are queued again. A Stop of a run that never started an engine (no
start token: stopped while queued by a rolling change, or while building by a worker that
died since) has no agent to end it: it is ended here, as the build worker ends the stop of
a build it cancels. Safe when two callers run at once: each row is taken by one conditional
UPDATE, whose winner alone sends the job or ends the stop.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db.models import Q

from web import tasks
from web.deployments.models import Deployment, DeploymentStatus, EventKind
from web.deployments.services.events import events_append
from web.deployments.services.lifecycle import deployment_mark_build_stopped

log = logging.getLogger(__name__)
S = DeploymentStatus
QUEUED_GRACE_S = 600  # a queued deployment waits this long behind others before a re-queue
REQUEUE_GRACE_S = 30  # after a re-queue, how long a worker has to take the build


def builds_requeue_dead(*, now: datetime) -> list[int]:
    """Queue again every build whose worker died and every deployment queued longer than
    QUEUED_GRACE_S that no worker took; the rows queued again."""
    expired = Q(build_lease_until__isnull=True) | Q(build_lease_until__lt=now)
    building = Q(status=S.BUILDING, build_lease_until__lt=now)
    forgotten = Q(status=S.QUEUED, updated_at__lt=now - timedelta(seconds=QUEUED_GRACE_S))
    queued = []
    for pk in Deployment.objects.filter(building | forgotten).filter(expired).values_list(
            "pk", flat=True):
        # The lease set here keeps the next ticks from queueing it again meanwhile.
        if Deployment.objects.filter(pk=pk).filter(expired).update(
                build_owner="", build_lease_until=now + timedelta(seconds=REQUEUE_GRACE_S)):
            log.warning("deployment %s: its build has no live worker; queued again", pk)
            events_append(deployment_id=pk, events=[(EventKind.STATUS, {
                "message": "the build's worker went away; the build was queued again"})])
            tasks.deployment_start_later(pk)
            queued.append(pk)
    never_started = Q(status=S.STOPPING, start_token="") & expired
    for pk in Deployment.objects.filter(never_started).values_list("pk", flat=True):
        if deployment_mark_build_stopped(deployment_id=pk):
            log.info("deployment %s: stopped before any engine of its run started", pk)
    return queued
