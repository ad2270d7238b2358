"""Writes: creating deployments, moving their status, appending events.

Every status change is one function per edge, a conditional UPDATE on the
expected source states; zero rows updated means someone else won.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection as db_connection
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from appliance.preflight import Finding, gpu_check_args, has_errors, run_preflight
from appliance.engine.recipes import Recipe, RecipeError, list_recipes, load_recipe
from appliance.engine.spec import DeploymentSpec, SpecError, spec_from_dict, spec_to_dict

from . import live
from .models import (
    ACTIVE_STATUSES,
    Deployment,
    DeploymentStatus,
    Event,
    EventKind,
)

log = logging.getLogger(__name__)
S = DeploymentStatus


# ---------------------------------------------------------------- validation


@dataclass
class DeploymentInputError(Exception):
    """Bad input: field -> messages, plus the pre-flight findings that blocked it."""

    errors: dict[str, list[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    needs_confirmation: bool = False

    def __str__(self) -> str:
        return "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in self.errors.items())


def _spec_errors(exc: SpecError) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for item in exc.errors:
        text = f"{item.message} {item.fix}".strip() if item.fix else item.message
        errors.setdefault(item.field or "non_field_errors", []).append(text)
    return errors


def recipe_names() -> list[str]:
    """Shipped recipes, then the site's own (APPLIANCE_RECIPES_DIR) under their file names."""
    return sorted(set(list_recipes()) | set(_site_recipes()))


def _site_recipes() -> dict[str, str]:
    if not settings.RECIPES_DIR:
        return {}
    return {p.stem: str(p) for p in Path(settings.RECIPES_DIR).glob("*.yaml")}


def recipe_load(name: str) -> Recipe:
    """A recipe by name: the site's file of that name wins over a shipped one."""
    return load_recipe(_site_recipes().get(name, name))


def _recipe_for(data: dict[str, Any]) -> Recipe | None:
    """The named recipe, or None when the spec names none (the spec check then says so).

    Recipe files by path are for the command line; over the network only shipped
    recipe names are accepted, so no request can make the server read a file.
    """
    name = data.get("recipe") if isinstance(data, dict) else None
    if not isinstance(name, str):
        return None
    if name not in recipe_names():
        choices = ", ".join(recipe_names())
        raise DeploymentInputError(
            errors={"recipe": [f"Unknown recipe {name!r}. Use one of: {choices}."]}
        )
    try:
        return recipe_load(name)
    except RecipeError as exc:
        raise DeploymentInputError(errors={"recipe": [str(exc)]}) from None


def deployment_validate(*, data: dict[str, Any]) -> tuple[DeploymentSpec, list[Finding]]:
    """Validate a spec under its recipe's engine defaults and run pre-flight.

    Raises DeploymentInputError naming each bad field, or the pre-flight errors.
    """
    recipe = _recipe_for(data)
    try:
        spec = spec_from_dict(data, engine_defaults=recipe.engine_defaults if recipe else None)
    except SpecError as exc:
        raise DeploymentInputError(errors=_spec_errors(exc)) from None
    findings = run_preflight(spec, recipe=recipe)
    if has_errors(findings):
        errors: dict[str, list[str]] = {}
        for finding in findings:
            if finding.severity == "error":
                errors.setdefault(finding.field or "non_field_errors", []).append(
                    f"{finding.message} Fix: {finding.fix} [{finding.rule}]"
                )
        raise DeploymentInputError(errors=errors, findings=findings)
    return spec, findings


def deployment_create(
    *,
    data: dict[str, Any],
    user: AbstractBaseUser | AnonymousUser | None = None,
    confirm_warnings: bool = False,
    rebuild_image: bool = False,
) -> Deployment:
    """Validate, pre-flight, store, and queue the deploy task once the row is committed.

    rebuild_image builds the engine image without the cache even when its tag exists
    (a moved base image tag, a suspect earlier build).
    """
    spec, findings = deployment_validate(data=data)
    warnings = [f for f in findings if f.severity == "warning"]
    if warnings and not confirm_warnings:
        raise DeploymentInputError(
            errors={"confirm_warnings": ["Pre-flight has warnings; confirm to deploy anyway."]},
            findings=findings,
            needs_confirmation=True,
        )
    with transaction.atomic():
        deployment = Deployment.objects.create(
            name=spec.name,
            spec=spec_to_dict(spec),
            recipe=spec.recipe,
            algorithm=spec.engine.speculative_algorithm,
            gpus=list(spec.gpus),
            preflight=[f.to_dict() for f in findings],
            rebuild_image=rebuild_image,
            created_by=user if user is not None and user.is_authenticated else None,  # type: ignore[misc]
        )
        events_append(
            deployment_id=deployment.pk,
            events=[
                ("status", {"status": S.QUEUED, "message": "deployment queued"}),
                ("preflight", {"findings": [f.to_dict() for f in findings]}),
            ],
        )
        transaction.on_commit(lambda: _enqueue("worker.tasks.deploy", deployment.pk))
    return deployment


def _enqueue(task_name: str, deployment_id: int) -> None:
    from worker.celery import app

    app.send_task(task_name, args=[deployment_id])


# -------------------------------------------------------------------- events


def events_append(
    *, deployment_id: int, events: Iterable[tuple[str, dict[str, Any]]]
) -> list[Event]:
    """Append events with gap-free seq numbers; publish them live after commit."""
    items = list(events)
    if not items:
        return []
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment_id).update(last_seq=F("last_seq") + len(items))
        last = Deployment.objects.values_list("last_seq", flat=True).get(pk=deployment_id)
        first = last - len(items) + 1
        rows = Event.objects.bulk_create(
            Event(deployment_id=deployment_id, seq=first + i, kind=kind, payload=payload)
            for i, (kind, payload) in enumerate(items)
        )
        wire = [row.to_wire() for row in rows]
        transaction.on_commit(lambda: live.publish(deployment_id, wire))
    return rows


# --------------------------------------------------------------- transitions


def _transition(
    deployment_id: int, *, sources: Iterable[str], target: str, message: str = "", **fields: Any
) -> bool:
    with transaction.atomic():
        updated = Deployment.objects.filter(pk=deployment_id, status__in=list(sources)).update(
            status=target, updated_at=timezone.now(), **fields
        )
        if updated:
            events_append(
                deployment_id=deployment_id,
                events=[(EventKind.PHASE, {"status": target, "message": message})],
            )
    return bool(updated)


def deployment_mark_building(*, deployment_id: int) -> bool:
    return _transition(deployment_id, sources=[S.QUEUED], target=S.BUILDING, phase="build")


def deployment_mark_starting(*, deployment_id: int, image: str) -> bool:
    return _transition(
        deployment_id, sources=[S.QUEUED, S.BUILDING], target=S.STARTING, phase="start", image=image
    )


def deployment_mark_checking(*, deployment_id: int) -> bool:
    return _transition(deployment_id, sources=[S.STARTING], target=S.CHECKING, phase="self_check")


def deployment_mark_loading(*, deployment_id: int) -> bool:
    return _transition(
        deployment_id, sources=[S.STARTING, S.CHECKING], target=S.LOADING, phase="weights"
    )


def deployment_mark_capturing(*, deployment_id: int) -> bool:
    return _transition(
        deployment_id,
        sources=[S.STARTING, S.CHECKING, S.LOADING],
        target=S.CAPTURING,
        phase="cuda_graph",
    )


def deployment_mark_ready(*, deployment_id: int, engine_url: str = "") -> bool:
    fields: dict[str, Any] = {"phase": "serving", "ready_at": timezone.now()}
    if engine_url:
        fields["engine_url"] = engine_url
    return _transition(
        deployment_id,
        sources=[S.STARTING, S.CHECKING, S.LOADING, S.CAPTURING],
        target=S.READY,
        **fields,
    )


def deployment_mark_stopping(*, deployment_id: int) -> bool:
    sources = [s for s in ACTIVE_STATUSES if s not in {S.STOPPING, S.QUEUED}]
    return _transition(deployment_id, sources=sources, target=S.STOPPING, message="stop requested")


def deployment_mark_stopped(*, deployment_id: int) -> bool:
    done = _transition(
        deployment_id,
        sources=[S.STOPPING, S.QUEUED],
        target=S.STOPPED,
        phase="",
        ended_at=timezone.now(),
    )
    if done:
        events_append(deployment_id=deployment_id, events=[(EventKind.END, {"status": S.STOPPED})])
    return done


def deployment_mark_failed(
    *, deployment_id: int, diagnosis: dict[str, Any], last_lines: list[str], message: str = ""
) -> bool:
    """Failed from any active state, carrying a diagnosis and the engine's last lines."""
    done = _transition(
        deployment_id,
        sources=list(ACTIVE_STATUSES),
        target=S.FAILED,
        message=message or diagnosis.get("summary", ""),
        diagnosis=diagnosis,
        last_lines=last_lines[-60:],
        ended_at=timezone.now(),
    )
    if done:
        events_append(
            deployment_id=deployment_id,
            events=[
                (EventKind.DIAGNOSIS, diagnosis),
                (EventKind.END, {"status": S.FAILED, "message": message}),
            ],
        )
    return done


ADVANCE = {
    "checking": deployment_mark_checking,
    "loading": deployment_mark_loading,
    "capturing": deployment_mark_capturing,
    "ready": deployment_mark_ready,
}


def deployment_request_stop(*, deployment: Deployment) -> Deployment:
    """A queued deployment stops at once; a running one goes to stopping and the worker stops it."""
    pk = deployment.pk
    if deployment_mark_stopped(deployment_id=pk):
        return Deployment.objects.get(pk=pk)
    if deployment_mark_stopping(deployment_id=pk):
        transaction.on_commit(lambda: _enqueue("worker.tasks.stop", pk))
    return Deployment.objects.get(pk=pk)


def deployment_set_progress(
    *,
    deployment_id: int,
    progress: dict[str, Any] | None = None,
    decode_stats: dict[str, Any] | None = None,
    log_cursor: float | None = None,
) -> None:
    fields: dict[str, Any] = {}
    if log_cursor is not None:
        fields["log_cursor"] = f"{log_cursor:.6f}"
    if progress is not None:
        fields["progress"] = progress
    if decode_stats is not None:
        fields["decode_stats"] = decode_stats
    if fields:
        Deployment.objects.filter(pk=deployment_id).update(**fields)


def _cursor_of(deployment: Deployment) -> float | None:
    try:
        return float(deployment.log_cursor) if deployment.log_cursor else None
    except ValueError:
        return None



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


def _runtime() -> Any:
    from appliance.runtime.containers import EngineRuntime

    return EngineRuntime()


def _container_plan(deployment: Deployment, image: str) -> Any:
    from appliance.runtime.containers import ContainerPlan
    from appliance.engine.spec import launch_args

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


class _BuildStopped(Exception):
    def __init__(self, outcome: str) -> None:
        self.outcome = outcome


def _ensure_image(deployment: Deployment) -> str | None:
    """An image tag to run, building it from the recipe when no override is configured."""
    if deployment.status in {S.STARTING, S.CHECKING, S.LOADING, S.CAPTURING}:
        return deployment.image  # adopted after a worker restart: the container may be running
    if settings.ENGINE_IMAGE:
        image = str(settings.ENGINE_IMAGE)
        event = {"kind": "cache_hit", "tag": image, "text": f"using the configured image {image}"}
        events_append(deployment_id=deployment.pk, events=[(EventKind.BUILD, event)])
        return image
    deployment_mark_building(deployment_id=deployment.pk)
    return _build(deployment)


def _build(deployment: Deployment) -> str | None:
    import threading

    from appliance.images.build import BuildCancelled, BuildFailed, build_image, plan_build

    pk = deployment.pk
    cancel = threading.Event()
    finished = threading.Event()

    def on_event(event: Any) -> None:
        events_append(deployment_id=pk, events=[(EventKind.BUILD, event.to_dict())])

    def watch_for_stop() -> None:
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

    watcher = threading.Thread(target=watch_for_stop, name=f"build-stop-{pk}", daemon=True)
    watcher.start()
    try:
        ca_bundle = Path(settings.BUILD_CA_BUNDLE) if settings.BUILD_CA_BUNDLE else None
        result = build_image(
            plan_build(recipe_load(deployment.recipe), ca_bundle=ca_bundle),
            client=_runtime().client,
            no_cache=deployment.rebuild_image,
            cancel=cancel,
            on_event=on_event,
        )
    except BuildCancelled:
        deployment_mark_stopped(deployment_id=pk)
        raise _BuildStopped(S.STOPPED) from None
    except BuildFailed as exc:
        diagnosis = {
            "cause": "image-build-failed",
            "summary": str(exc),
            "fix": "Read the failing build step below; fix the recipe or the patch it names.",
            "evidence": exc.to_dict(),
        }
        deployment_mark_failed(
            deployment_id=pk, diagnosis=diagnosis, last_lines=list(exc.last_output_lines)
        )
        raise _BuildStopped(S.FAILED) from None
    finally:
        finished.set()
        watcher.join(timeout=5)
    if cancel.is_set():  # stopped just as the last step finished: honour the stop
        deployment_mark_stopped(deployment_id=pk)
        raise _BuildStopped(S.STOPPED)
    return str(result.tag)


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
