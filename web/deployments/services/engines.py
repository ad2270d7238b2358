"""The engine container, the worker's side: run a deployment, watch it, stop it, supervise it.

A run ensures the image (builds), starts the container and watches it until ready or failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from django.conf import settings

from appliance.engine.spec import spec_from_dict
from appliance.preflight import gpu_check_args

from ..models import Deployment, DeploymentStatus, Event, EventKind
from ._shared import _runtime
from .builds import _BuildStopped, _ensure_image
from .deployments import (
    ADVANCE,
    deployment_mark_failed,
    deployment_mark_starting,
    deployment_mark_stopped,
    deployment_set_progress,
)
from .events import events_append

log = logging.getLogger(__name__)
S = DeploymentStatus


# ------------------------------------------------------- engine (the worker)


class _DeploymentSink:
    """Adapts an engine watch to this deployment's row and event log."""

    def __init__(self, deployment_id: int) -> None:
        self.deployment_id = deployment_id
        self.progress: dict[str, Any] = {}
        self.decode: dict[str, Any] | None = None

    def emit(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        changed = False
        for kind, payload in events:
            if kind in (EventKind.PROGRESS, EventKind.SELFCHECK):
                changed = _fold_progress(self.progress, payload) or changed
            elif kind == EventKind.METRIC and payload.get("kind") == "decode_stats":
                self.decode = payload
        events_append(deployment_id=self.deployment_id, events=events)
        cursor = time.time() if any(kind == EventKind.LOG for kind, _ in events) else None
        deployment_set_progress(
            deployment_id=self.deployment_id,
            progress=self.progress if changed else None,
            decode_stats=self.decode,
            log_cursor=cursor,
        )

    def advance(self, status: str) -> bool:
        step = ADVANCE.get(status)
        return step(deployment_id=self.deployment_id) if step else False

    def stop_requested(self) -> bool:
        return Deployment.objects.filter(pk=self.deployment_id, status=S.STOPPING).exists()


def _fold_selfcheck(progress: dict[str, Any], event: dict[str, Any]) -> None:
    """The self-check's state for the summary: its checks so far, then the verdict."""
    kind = event["kind"]
    if kind == "selfcheck_begin":
        progress["self_check"] = {"finished": False, "ok": None, "gpus": len(event["gpus"]),
                                  "widths": {r["role"]: r["width"] for r in event["roles"]},
                                  "checks": []}
        return
    state = progress.setdefault("self_check", {"finished": False, "ok": None, "checks": []})
    if kind == "selfcheck_check":
        state["checks"].append({"id": event["id"], "ok": event["ok"]})
    else:
        allreduce = event.get("allreduce") or {}
        state.update(finished=True, ok=event["ok"], elapsed_s=event.get("elapsed_s"),
                     busbw_gbps=allreduce.get("busbw_gbps"),
                     checks=[{"id": c["id"], "ok": c["ok"]} for c in event.get("checks", [])])


def _fold_progress(progress: dict[str, Any], event: dict[str, Any]) -> bool:
    """Keep the latest shard and graph-capture progress for the detail page and the API."""
    kind = event.get("kind")
    if kind in ("selfcheck_begin", "selfcheck_check", "selfcheck_report"):
        _fold_selfcheck(progress, event)
    elif kind == "weights_begin":
        progress["weights"] = {"done": 0, "total": None, "finished": False}
    elif kind == "weights_progress":
        progress["weights"] = {"done": event["done"], "total": event["total"], "finished": False}
    elif kind == "weights_end":
        weights = progress.setdefault("weights", {"done": None, "total": None})
        weights.update(finished=True, elapsed_s=event.get("elapsed_s"))
    elif kind == "kv_cache":
        progress["kv_cache_tokens"] = event.get("tokens")
    elif kind == "capture_begin":
        progress["capture"] = {
            "role": event.get("role"),
            "mode": event.get("mode"),
            "num_tokens_per_req": event.get("num_tokens_per_req"),
            "bs": None,
            "done": 0,
            "total": None,
            "finished": False,
        }
    elif kind == "capture_progress":
        capture = progress.setdefault("capture", {})
        capture.update(bs=event["bs"], done=event["done"], total=event["total"])
    elif kind == "capture_end":
        capture = progress.setdefault("capture", {})
        capture.update(finished=True, elapsed_s=event.get("elapsed_s"))
        progress.setdefault("captures", []).append(dict(capture))
    else:
        return False
    return True


def _container_plan(deployment: Deployment, image: str) -> Any:
    from appliance.engine.launch import launch_args
    from appliance.runtime.containers import ContainerPlan

    spec = spec_from_dict(deployment.spec)
    launch = launch_args(spec)
    volumes: dict[str, dict[str, str]] = {}
    if settings.MODELS_DIR:
        volumes[str(settings.MODELS_DIR)] = {"bind": "/models", "mode": "ro"}
    env = {**launch.env, **settings.ENGINE_EXTRA_ENV}
    if spec.self_check and settings.ENGINE_GPU_CHECK:
        # The image's entrypoint runs appliance.selfcheck with these before the engine.
        env["APPLIANCE_GPU_CHECK"] = "1"
        env["APPLIANCE_GPU_CHECK_ARGS"] = json.dumps(gpu_check_args(spec))
    return ContainerPlan(
        deployment_id=str(deployment.pk),
        image=image,
        argv=launch.argv,
        env=env,
        gpus=list(deployment.gpus) if settings.ENGINE_GPU_REQUESTS else [],
        container_port=spec.engine.port,
        network=settings.ENGINE_NETWORK or None,
        volumes=volumes,
    )


def deployment_run(*, deployment_id: int) -> str:
    """The deploy task's one service: image, container, watch until ready or failed."""
    deployment = Deployment.objects.get(pk=deployment_id)
    if deployment.is_terminal or deployment.status in {S.READY, S.STOPPING}:
        return str(deployment.status)
    try:
        image = _ensure_image(deployment)
    except _BuildStopped as exc:
        return exc.outcome
    if image is None:
        return str(Deployment.objects.get(pk=deployment_id).status)
    deployment_mark_starting(deployment_id=deployment_id, image=image)
    deployment.refresh_from_db()
    if deployment.status == S.STOPPING:
        return deployment_stop(deployment_id=deployment_id)
    return _watch(deployment, image)


def _cursor_of(deployment: Deployment) -> float | None:
    try:
        return float(deployment.log_cursor) if deployment.log_cursor else None
    except ValueError:
        return None


def _watch(deployment: Deployment, image: str) -> str:
    from appliance.runtime.watch import EngineWatch, WatchOptions

    pk = deployment.pk
    runtime = _runtime()
    options = WatchOptions(ready_timeout_s=float(settings.ENGINE_READY_TIMEOUT_S))
    plan = _container_plan(deployment, image)
    Deployment.objects.filter(pk=pk).update(container_name=runtime.container_name(str(pk)))
    sink = _DeploymentSink(pk)
    try:
        result = EngineWatch(runtime, plan, sink, options).run(since=_cursor_of(deployment))
    except Exception as exc:
        log.exception("deployment %s: engine watch failed", pk)
        diagnosis = {"cause": "engine-start-failed", "summary": str(exc),
                     "fix": "Check that the engine image exists and Docker is reachable.",
                     "evidence": {}}
        deployment_mark_failed(deployment_id=pk, diagnosis=diagnosis, last_lines=[])
        # The failure is recorded; a Docker that cannot stop the container must not hide it.
        with contextlib.suppress(Exception):
            runtime.stop(str(pk), timeout_s=settings.ENGINE_STOP_TIMEOUT_S)
        return S.FAILED
    if result.outcome == "ready":
        # From here the supervisor ships the engine's output, starting where the watch ended.
        Deployment.objects.filter(pk=pk).update(
            engine_url=result.engine_url, log_cursor=f"{time.time():.6f}"
        )
        return S.READY
    runtime.stop(str(pk), timeout_s=settings.ENGINE_STOP_TIMEOUT_S)
    if result.outcome == "stopped":
        deployment_mark_stopped(deployment_id=pk)
        return S.STOPPED
    diagnosis = result.diagnosis.to_dict() if result.diagnosis else {}
    deployment_mark_failed(deployment_id=pk, diagnosis=diagnosis, last_lines=result.last_lines,
                           message=result.message)
    return S.FAILED


def deployment_stop(*, deployment_id: int) -> str:
    """The stop task's one service: docker stop with a timeout, remove, mark stopped."""
    deployment = Deployment.objects.get(pk=deployment_id)
    if deployment.status != S.STOPPING:
        return str(deployment.status)
    _runtime().stop(str(deployment_id), timeout_s=settings.ENGINE_STOP_TIMEOUT_S)
    deployment_mark_stopped(deployment_id=deployment_id)
    return S.STOPPED


def deployments_supervise() -> int:
    """Reconcile ready deployments with Docker: ship their new output, fail the dead ones."""
    from appliance.runtime.watch import supervise_tick

    runtime = _runtime()
    count = 0
    for deployment in Deployment.objects.filter(status=S.READY):
        since = float(deployment.log_cursor or 0) or deployment.updated_at.timestamp()
        until = time.time()
        history = [
            str(e.payload.get("text", ""))
            for e in Event.objects.filter(deployment=deployment, kind="log").order_by("-seq")[:400]
        ][::-1]
        tick = supervise_tick(runtime, str(deployment.pk), since, until, history)
        sink = _DeploymentSink(deployment.pk)
        if tick.events:
            sink.emit(tick.events)
        Deployment.objects.filter(pk=deployment.pk).update(log_cursor=f"{until:.6f}")
        if tick.exited:
            runtime.stop(str(deployment.pk), timeout_s=settings.ENGINE_STOP_TIMEOUT_S)
            deployment_mark_failed(
                deployment_id=deployment.pk,
                diagnosis=tick.diagnosis.to_dict() if tick.diagnosis else {},
                last_lines=tick.last_lines,
                message="the engine exited while serving",
            )
        count += 1
    return count
