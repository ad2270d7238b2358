"""Apply: a finished Tune's recommended candidate put on its deployment, as a task (rolling
when the deployment has replicas, else stopped and started on the candidate's spec), its
state kept on the run (`applied`)."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from appliance.tune import Candidate, DeployFailed, candidate_spec
from web import tasks
from web.deploy import services as deploying
from web.deployments import services as deployments
from web.deployments.models import Deployment
from web.deployments.services.rolling import ROLLING, deployment_has_replicas, deployment_replicas

from .choices import BenchmarkStatus
from .services import BenchmarkInputError
from .tune_deployers import POLL_S, PanelDeployer
from .tune_models import TuneRun

# The bound on an Apply's rolling redeploy, per replica, beyond its deploy timeout.
ROLL_SLACK_S = 300.0


def recommended(run: TuneRun) -> str | None:
    """The candidate the recommendation names at the most levels (on a tie, the faster
    summed over its levels); None when it names none."""
    levels = ((run.results or {}).get("recommendation") or {}).get("per_level") or []
    counts: dict[str, list[float]] = {}
    for entry in levels:
        if entry.get("candidate"):
            counts.setdefault(entry["candidate"], []).append(entry["output_throughput"] or 0)
    if not counts:
        return None
    return max(counts, key=lambda name: (len(counts[name]), sum(counts[name])))


def tune_apply(*, run: TuneRun, candidate: str | None = None, user: Any = None) -> TuneRun:
    """Redeploy the Tune's deployment with a recommended candidate (default: `recommended`):
    rolling when it has replicas, else stopped and started on the new spec (a task)."""
    if run.status != BenchmarkStatus.DONE:
        raise BenchmarkInputError({"status": f"Tune #{run.pk} is {run.status}; only a "
                                   "finished Tune is applied"})
    names = {e["candidate"] for e in (run.results.get("recommendation") or {}).get(
        "per_level", []) if e.get("candidate")}
    chosen = candidate or recommended(run)
    if chosen is None or chosen not in names:
        raise BenchmarkInputError({"candidate": f"choose one the Tune recommends: "
                                   f"{sorted(names) or 'none'}"})
    row = (Deployment.objects.filter(pk=run.deployment_id).first()
           if run.deployment_id is not None else None)
    if row is None:
        raise BenchmarkInputError({"deployment": "the Tune's deployment is gone"})
    if (run.applied or {}).get("state") in ("queued", "running"):
        raise BenchmarkInputError({"candidate": "an Apply of this Tune is under way"})
    applied = {"candidate": chosen, "state": "queued", "message": "", "by": getattr(
        user, "username", ""), "at": timezone.now().isoformat()}
    with transaction.atomic():
        TuneRun.objects.filter(pk=run.pk).update(applied=applied)
        tasks.tune_apply_later(run.pk)
    run.refresh_from_db()
    return run


def _applied(run_id: int, **values: Any) -> None:
    run = TuneRun.objects.get(pk=run_id)
    TuneRun.objects.filter(pk=run_id).update(applied={**run.applied, **values})


def _apply_rolling(run: TuneRun, row: Deployment, candidate: Candidate,
                   spec: dict[str, Any]) -> str:
    """The winner over every replica by the rolling redeploy (rolling.py: one replica at a
    time, drained first, the others serving), followed until the roll ends, bounded."""
    deploying.deployment_redeploy(deployment_id=row.pk, data=spec, user=run.created_by,
                                  confirm_warnings=True)
    count = len(deployment_replicas(deployment=row))
    _applied(run.pk, state="rolling", message=f"rolling redeploy of {row.name} with "
             f"{candidate.name} under way (one replica at a time, {count} replicas)")
    bound = time.monotonic() + count * (float(run.config.get("deploy_timeout_s", 1800)) +
                                        settings.ROLL_DRAIN_TIMEOUT_S + ROLL_SLACK_S)
    rolling: dict[str, Any] = {}
    while time.monotonic() < bound:
        rolling = Deployment.objects.filter(pk=row.pk).values_list(
            "rolling", flat=True).first() or {}
        if rolling.get("state") != ROLLING:
            break
        time.sleep(POLL_S)
    text = rolling.get("text") or rolling.get("state") or "no roll found"
    if rolling.get("state") == "done":
        _applied(run.pk, state="done", message=f"{row.name} redeployed with "
                 f"{candidate.name}, rolling: {text}")
        return "done"
    if rolling.get("state") == ROLLING:
        text = f"still rolling after the bound: {text}"
    _applied(run.pk, state="failed", message=text)
    return "failed"


def tune_apply_run(*, run_id: int) -> str:
    """The Apply task: the candidate's spec on the deployment as it is now."""
    run = TuneRun.objects.select_related("created_by").get(pk=run_id)
    applied = run.applied or {}
    if applied.get("state") != "queued":
        return "not queued"
    _applied(run_id, state="running")
    candidate = next((Candidate(c["name"], c["engine"]) for c in run.config["candidates"]
                      if c["name"] == applied["candidate"]), None)
    row = (Deployment.objects.filter(pk=run.deployment_id).first()
           if run.deployment_id is not None else None)
    if candidate is None or row is None:
        _applied(run_id, state="failed", message="its candidate or deployment is gone")
        return "failed"
    spec = candidate_spec(row.spec, candidate)
    try:
        if deployment_has_replicas(deployment=row):
            return _apply_rolling(run, row, candidate, spec)
        deployer = PanelDeployer(run)
        deployer.original = {**deployer.original, "spec": row.spec}
        deployer.stop_engine()
        deployer.start_spec(spec)
        deployer.wait_ready(None, deployer.deploy_timeout_s)
    except (DeployFailed, deployments.DeploymentInputError) as exc:
        _applied(run_id, state="failed", message=str(exc))
        return "failed"
    _applied(run_id, state="done", message=f"{row.name} redeployed with {candidate.name}")
    return "done"
