"""The progress an engine's log lines fold into: shard and graph-capture progress, the
self-check's state and each model's load, for the detail page and the API.

Framework-free: every host's agent (appliance.runtime.remote_agent) folds its batches
this way before it ships them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.events import (
    CAPTURE_BEGIN,
    CAPTURE_END,
    CAPTURE_PROGRESS,
    KV_CACHE,
    SELFCHECK_BEGIN,
    SELFCHECK_CHECK,
    SELFCHECK_REPORT,
    WEIGHTS_BEGIN,
    WEIGHTS_END,
    WEIGHTS_PROGRESS,
    CaptureBeginEvent,
    SelfcheckBeginEvent,
    SelfcheckCheckEvent,
    SelfcheckReportEvent,
    WeightsBeginEvent,
    WeightsEndEvent,
    engine_event,
)


def _fold_selfcheck(progress: dict[str, Any],
                    event: SelfcheckBeginEvent | SelfcheckCheckEvent | SelfcheckReportEvent
                    ) -> None:
    """The self-check's state for the summary: its checks so far, then the verdict."""
    if event["kind"] == SELFCHECK_BEGIN:
        progress["self_check"] = {"finished": False, "ok": None, "gpus": len(event["gpus"]),
                                  "widths": {r["role"]: r["width"] for r in event["roles"]},
                                  "checks": []}
        return
    state = progress.setdefault("self_check", {"finished": False, "ok": None, "checks": []})
    if event["kind"] == SELFCHECK_CHECK:
        state["checks"].append({"id": event["id"], "ok": event["ok"]})
    else:
        allreduce = event.get("allreduce") or {}
        state.update(finished=True, ok=event["ok"], elapsed_s=event.get("elapsed_s"),
                     busbw_gbps=allreduce.get("busbw_gbps"),
                     checks=[{"id": c["id"], "ok": c["ok"]} for c in event.get("checks", [])])


def _fold_width(progress: dict[str, Any], event: CaptureBeginEvent) -> None:
    """Each role's captured verify width beside the width the spec needs."""
    role, captured = event.get("role"), event.get("num_tokens_per_req")
    if event.get("mode") == "verify" and role and captured:
        progress.setdefault("widths", {})[role] = {
            "captured": captured, "needed": event.get("needed_tokens_per_req")}


def _model_key(event: WeightsBeginEvent | WeightsEndEvent) -> str:
    """The progress key of a weight load: the target's "weights", the drafter's its own."""
    return "draft_weights" if event.get("model") == "draft" else "weights"


def _fold_load(progress: dict[str, Any], event: WeightsEndEvent) -> None:
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


# The parser kinds that move the progress the detail page and the API show.
FOLDED_KINDS = frozenset({SELFCHECK_BEGIN, SELFCHECK_CHECK, SELFCHECK_REPORT, WEIGHTS_BEGIN,
                          WEIGHTS_PROGRESS, WEIGHTS_END, KV_CACHE, CAPTURE_BEGIN,
                          CAPTURE_PROGRESS, CAPTURE_END})


def progress_fold(progress: dict[str, Any], payload: Mapping[str, Any]) -> bool:
    """Keep the latest shard and graph-capture progress for the detail page and the API."""
    if payload.get("kind") not in FOLDED_KINDS:
        return False
    event = engine_event(payload)
    if (event["kind"] == SELFCHECK_BEGIN or event["kind"] == SELFCHECK_CHECK
            or event["kind"] == SELFCHECK_REPORT):
        _fold_selfcheck(progress, event)
    elif event["kind"] == WEIGHTS_BEGIN:
        progress["loading"] = _model_key(event)
        progress[progress["loading"]] = {"done": 0, "total": None, "finished": False}
    elif event["kind"] == WEIGHTS_PROGRESS:
        key = progress.get("loading", "weights")
        # A piece of the bar read after its end line (the pieces come on their own stream,
        # in no order with the lines) leaves the finished load as it is.
        if not (progress.get(key) or {}).get("finished"):
            progress[key] = {"done": event["done"], "total": event["total"], "finished": False}
    elif event["kind"] == WEIGHTS_END:
        _fold_load(progress, event)
    elif event["kind"] == KV_CACHE:
        progress["kv_cache_tokens"] = event.get("tokens")
    elif event["kind"] == CAPTURE_BEGIN:
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
    elif event["kind"] == CAPTURE_PROGRESS:
        capture = progress.setdefault("capture", {})
        capture.update(bs=event["bs"], done=event["done"], total=event["total"])
    elif event["kind"] == CAPTURE_END:
        capture = progress.setdefault("capture", {})
        capture.update(finished=True, elapsed_s=event.get("elapsed_s"),
                       mem_usage_gb=event.get("mem_usage_gb"))
        _fold_capture(progress.setdefault("captures", []), capture)
    return True
