"""The engine container as the agent starts it: its plan, its identity, and the progress
its log lines fold into.

The build worker (web/builder/) ensures the image and hands the deployment over; the agent
(controller.py) starts, follows and ends the container.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from appliance.engine.launch import launch_args
from appliance.engine.spec import spec_from_dict
from appliance.preflight import gpu_check_args
from appliance.runtime.containers import ContainerPlan, EngineRuntimeError, Identity
from web.deployments.models import Deployment
from web.deployments.services.installation import instance_id
from web.deployments.services.loadtime import deployment_models_refused, engine_model_mounts


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


def _fold_width(progress: dict[str, Any], event: dict[str, Any]) -> None:
    """Each role's captured verify width beside the width the spec needs."""
    role, captured = event.get("role"), event.get("num_tokens_per_req")
    if event.get("mode") == "verify" and role and captured:
        progress.setdefault("widths", {})[role] = {
            "captured": captured, "needed": event.get("needed_tokens_per_req")}


def _model_key(event: dict[str, Any]) -> str:
    """The progress key of a weight load: the target's "weights", the drafter's its own."""
    return "draft_weights" if event.get("model") == "draft" else "weights"


def _fold_load(progress: dict[str, Any], event: dict[str, Any]) -> None:
    """Each model's load time (every TP rank loads its part: the slowest is the load)."""
    key = _model_key(event)
    weights = progress.setdefault(key, {"done": None, "total": None})
    elapsed = event.get("elapsed_s")
    if weights.get("finished") and weights.get("elapsed_s") is not None and elapsed is not None:
        elapsed = max(elapsed, weights["elapsed_s"])
    weights.update(finished=True, elapsed_s=elapsed, model_type=event.get("model_type"),
                   mem_usage_gb=event.get("mem_usage_gb"),
                   ranks=weights.get("ranks", 0) + 1 if weights.get("finished") else 1)


def _fold_capture(captures: list[dict[str, Any]], capture: dict[str, Any]) -> None:
    """One entry per role, mode and width: the TP ranks print the same capture each."""
    key = (capture.get("role"), capture.get("mode"), capture.get("num_tokens_per_req"))
    for seen in captures:
        if (seen.get("role"), seen.get("mode"), seen.get("num_tokens_per_req")) == key:
            seen["ranks"] = seen.get("ranks", 1) + 1
            seen["elapsed_s"] = max(seen.get("elapsed_s") or 0, capture.get("elapsed_s") or 0)
            return
    captures.append({**capture, "ranks": 1})


def progress_fold(progress: dict[str, Any], event: dict[str, Any]) -> bool:
    """Keep the latest shard and graph-capture progress for the detail page and the API."""
    kind = event.get("kind")
    if kind in ("selfcheck_begin", "selfcheck_check", "selfcheck_report"):
        _fold_selfcheck(progress, event)
    elif kind == "weights_begin":
        progress["loading"] = _model_key(event)
        progress[progress["loading"]] = {"done": 0, "total": None, "finished": False}
    elif kind == "weights_progress":
        progress[progress.get("loading", "weights")] = {
            "done": event["done"], "total": event["total"], "finished": False}
    elif kind == "weights_end":
        _fold_load(progress, event)
    elif kind == "kv_cache":
        progress["kv_cache_tokens"] = event.get("tokens")
    elif kind == "capture_begin":
        _fold_width(progress, event)
        progress["capture"] = {
            "role": event.get("role"),
            "mode": event.get("mode"),
            "num_tokens_per_req": event.get("num_tokens_per_req"),
            "needed_tokens_per_req": event.get("needed_tokens_per_req"),
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
        capture.update(finished=True, elapsed_s=event.get("elapsed_s"),
                       mem_usage_gb=event.get("mem_usage_gb"))
        _fold_capture(progress.setdefault("captures", []), capture)
    else:
        return False
    return True


def identity_of(deployment: Deployment) -> Identity:
    """The engine container's identity: this install, the deployment, this start."""
    return Identity(str(deployment.pk), instance_id(), deployment.start_token)


def container_plan(deployment: Deployment, image: str) -> ContainerPlan:
    spec = spec_from_dict(deployment.spec)
    launch = launch_args(spec)
    refused = deployment_models_refused(deployment=deployment)
    if refused:  # never mounted: the agent fails the start before this (agent._may_start)
        raise EngineRuntimeError(f"not verified in the model store: {', '.join(refused)}")
    volumes: dict[str, dict[str, str]] = {}
    if settings.MODELS_DIR:
        volumes = engine_model_mounts(argv=launch.argv, models_dir=str(settings.MODELS_DIR))
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
        instance_id=instance_id(),
        start_token=deployment.start_token,
        shm_size=spec.shm_size or settings.ENGINE_SHM_SIZE,
        pids_limit=settings.ENGINE_PIDS_LIMIT or None,
        mem_limit=settings.ENGINE_MEMORY_LIMIT or None,
        # Only this deployment's declared names; their values are read at container start.
        secrets=list(launch.secrets),
        secrets_dir=settings.ENGINE_SECRETS_DIR,
    )
