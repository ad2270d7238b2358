"""The build worker's part of a deployment: the deploy task's one service (deployment_run)
and the engine image it needs, the configured one or a build of its recipe.

The build worker hands a deployment over to the engine agent by moving it to `starting`;
it never starts, stops or removes an engine container (the agent owns those). A stop
requested during a build moves the deployment to `stopping`: the build sees it and is
cancelled (a build, not an engine, is ended here), and the agent marks it stopped.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection as db_connection
from django.db.models import Q
from django.utils import timezone

from appliance.images.build import (
    BuildCancelled,
    BuildFailed,
    BuildResult,
    build_image,
    image_id,
)
from appliance.images.plan import plan_build
from appliance.lifecycle import Process
from appliance.logs.appliance_causes import IMAGE_BUILD_FAILED
from appliance.runtime.containers import EngineRuntime
from web import tasks
from web.deployments.models import Deployment, DeploymentStatus, EventKind
from web.deployments.services.deployments import recipe_load
from web.deployments.services.events import events_append
from web.deployments.services.lifecycle import (
    deployment_mark_build_stopped,
    deployment_mark_building,
    deployment_mark_failed,
    deployment_mark_starting,
)
from web.fleet.selectors import joined_host_of
from web.store.loadtime import MODEL_WAIT_POLL_S, deployment_model_wait

S = DeploymentStatus


class BuildStopped(Exception):
    """The build ended without an image (stopped or failed); outcome: the status it left."""

    def __init__(self, outcome: str) -> None:
        self.outcome = outcome


def deployment_run(*, deployment_id: int) -> str:
    """The deploy task's one service: the image, then hand the engine to the engine agent.

    The deployment goes to `starting` with a new start token; the agent that owns this
    host's engines starts the container, follows it to ready, and on for its whole life.
    """
    deployment = Deployment.objects.get(pk=deployment_id)
    if deployment.status == S.QUEUED:
        waited = deployment_model_wait(deployment_id=deployment_id)
        if waited == "waiting":  # the download runs on: look again in a moment
            tasks.deployment_start_later(deployment_id, countdown=MODEL_WAIT_POLL_S)
        if waited != "ready":
            return waited
    if deployment.status not in {S.QUEUED, S.BUILDING} or not build_claim(deployment_id):
        return str(deployment.status)  # done already, or a live worker builds it
    try:
        image = ensure_image(deployment)
    except BuildStopped as exc:
        if exc.outcome == S.STOPPING and deployment_mark_build_stopped(
                deployment_id=deployment_id):
            return str(S.STOPPED)
        return exc.outcome
    if image is None:
        return str(Deployment.objects.get(pk=deployment_id).status)
    deployment_mark_starting(deployment_id=deployment_id, image=image,
                             start_token=secrets.token_hex(8))
    return str(Deployment.objects.get(pk=deployment_id).status)


BUILD_LEASE_S = 6.0  # a build with no heartbeat this long is queued again (engine agent)


def build_claim(pk: int) -> bool:
    """Take the deployment's build; False when a live worker already builds it."""
    now = timezone.now()
    free = Q(build_owner="") | Q(build_lease_until__isnull=True) | Q(build_lease_until__lt=now)
    return bool(Deployment.objects.filter(pk=pk, status__in=[S.QUEUED, S.BUILDING]).filter(
        free).update(build_owner=_worker_id(), build_lease_until=now + timedelta(
            seconds=BUILD_LEASE_S)))


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _heartbeat(pk: int, owner: str, finished: threading.Event) -> None:
    try:
        while not finished.wait(BUILD_LEASE_S / 3):
            until = timezone.now() + timedelta(seconds=BUILD_LEASE_S)
            Deployment.objects.filter(pk=pk, status__in=[S.QUEUED, S.BUILDING],
                                      build_owner=owner).update(build_lease_until=until)
    finally:
        db_connection.close()


def ensure_image(deployment: Deployment) -> str | None:
    """An image tag to run, building it from the recipe when no override is configured."""
    finished = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(deployment.pk, _worker_id(), finished),
                            daemon=True,
                            name=f"build-lease-{deployment.pk}")
    beat.start()
    try:
        return _image_for(deployment)
    finally:
        finished.set()


def _image_for(deployment: Deployment) -> str | None:
    if settings.ENGINE_IMAGE:
        image = str(settings.ENGINE_IMAGE)
        event = {"kind": "cache_hit", "tag": image, "text": f"using the configured image {image}"}
        events_append(deployment_id=deployment.pk, events=[(EventKind.BUILD, event)])
        return image
    host = joined_host_of(deployment_id=deployment.pk)
    if host:
        # Its image is built by the host that runs it, on its own Docker, from the same
        # recipe (its lock checked against this panel's first): no image crosses machines.
        event = {"kind": "handed_over", "text": f"the image is built from recipe "
                 f"{deployment.recipe} on host {host}, which runs the engine"}
        events_append(deployment_id=deployment.pk, events=[(EventKind.BUILD, event)])
        return ""
    deployment_mark_building(deployment_id=deployment.pk)
    return _build(deployment)


def _build(deployment: Deployment) -> str | None:
    pk = deployment.pk
    cancel = threading.Event()
    finished = threading.Event()
    watcher = _start_stop_watcher(pk, cancel, finished)
    try:
        result = _run_build(deployment, cancel)
    except BuildCancelled:
        raise _build_cancelled(pk) from None
    except BuildFailed as exc:
        _mark_build_failed(pk, exc)
        raise BuildStopped(S.FAILED) from None
    finally:
        finished.set()
        watcher.join(timeout=5)
    if cancel.is_set():  # stopped just as the last step finished: honour the stop
        raise _build_cancelled(pk)
    return str(result.tag)


def _start_stop_watcher(
    pk: int, cancel: threading.Event, finished: threading.Event
) -> threading.Thread:
    """A daemon thread that sets cancel when the build's stop is requested."""
    watcher = threading.Thread(
        target=_watch_for_stop, args=(pk, cancel, finished), name=f"build-stop-{pk}", daemon=True
    )
    watcher.start()
    return watcher


def _watch_for_stop(pk: int, cancel: threading.Event, finished: threading.Event) -> None:
    # A RUN step can be silent for minutes (a CUDA kernel compile), so a stop request
    # (panel or API: the status leaves `building`) is looked for on a clock, not only
    # when the build says something; build_image then kills the running step.
    try:
        while not finished.wait(settings.BUILD_CANCEL_POLL_MS / 1000):
            if not Deployment.objects.filter(pk=pk, status=S.BUILDING).exists():
                cancel.set()
                return
    finally:
        db_connection.close()


def _run_build(deployment: Deployment, cancel: threading.Event) -> BuildResult:
    """Build the recipe's image, each build event appended to the deployment's log."""
    pk = deployment.pk
    client = EngineRuntime().client
    recipe = recipe_load(deployment.recipe)

    def on_event(event: Any) -> None:
        events_append(deployment_id=pk, events=[(EventKind.BUILD, event.to_dict())])

    ca_bundle = _ca_bundle()
    return build_image(
        plan_build(recipe, ca_bundle=ca_bundle, base_id=image_id(client, recipe.base_image)),
        client=client,
        no_cache=deployment.rebuild_image,
        cancel=cancel,
        on_event=on_event,
    )


def _ca_bundle() -> Path | None:
    """The proxy CA for download steps; compose mounts /dev/null there when none is set."""
    path = Path(settings.BUILD_CA_BUNDLE) if settings.BUILD_CA_BUNDLE else None
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return None
    return path


def _build_cancelled(pk: int) -> BuildStopped:
    """The exception that ends a cancelled build, for the caller to raise. The deployment is
    stopping (or already stopped); no engine of the run has started, so the build worker
    marks it stopped itself (deployment_mark_build_stopped): no agent has anything of it."""
    return BuildStopped(str(Deployment.objects.values_list("status", flat=True).get(pk=pk)))


def _mark_build_failed(pk: int, exc: BuildFailed) -> None:
    diagnosis = IMAGE_BUILD_FAILED.worded(summary=str(exc), evidence=exc.to_dict())
    deployment_mark_failed(
        deployment_id=pk, diagnosis=diagnosis, last_lines=list(exc.last_output_lines),
        by=Process.BUILDER)
