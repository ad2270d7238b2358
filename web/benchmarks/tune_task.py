"""A Tune's task (the Celery task's body, on the bench queue: appliance.tune.run_tune with the
deployment's own row as its Deployer) and the sweep of Tunes whose task is gone.

While a Tune runs, its deployment's replica 0 serves its candidates one after another, not
its own spec, out of the gateway's rotation (drained); a deployment with replicas keeps
serving on the others. The row's `tune_hold` says so, and until when, for its page and API;
the Tune empties it when it gives the deployment back, restored.

A running Tune's task writes its progress with a beat every POLL_S; `tune_sweep` (the
panel loop, web/loop.py) sends the task again for one whose beat stopped TUNE_LOST_S ago (its
worker died: the task, delivered again, restores and ends it) or that no worker took, and
ends one that no worker takes even then.
"""

from __future__ import annotations

import threading
import time
import traceback
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from appliance.bench.prompts import Prompt
from appliance.tune import Candidate, TuneOptions, TuneProgress, run_tune
from web import tasks
from web.deployments import services as deployments
from web.deployments.models import Deployment, EventKind
from web.deployments.simulator import image_is_simulator

from .choices import ACTIVE_STATUSES, BenchmarkStatus
from .runs import run_claim, run_finish, run_polled
from .services import BenchmarkInputError
from .tune_deployers import POLL_S, STOP_WAIT_S, PanelDeployer, deployer_for, side_name
from .tune_models import TuneRun
from .tune_services import side_gpus, tune_prompts

# A running Tune whose task wrote no beat for settings.TUNE_LOST_S: its worker is gone (the
# task beats every POLL_S, its restore included). A queued one that no worker took this
# long: its message is lost (as a queued deployment's, web/builder/requeue.py's
# QUEUED_GRACE_S).
QUEUED_LOST_S = 600.0
# A copy of the task that finds its Tune running watches this long for a beat before it
# takes the Tune over (a live worker beats every POLL_S).
ALIVE_CHECK_S = 6 * POLL_S


def _lossless_prompts(config: dict[str, Any], prompts: list[Prompt]) -> list[str]:
    """The first of the workload's own prompts (distinct); a synthetic workload's are
    random words, so the shipped set checks it instead."""
    if config["prompt_source"] == "synthetic":
        prompts = tune_prompts({**config, "prompt_source": "builtin"}, "")
    texts = list(dict.fromkeys(p.text for p in prompts))
    return texts[:config["lossless_prompts"]]


def tune_hold(*, deployment_id: int) -> dict[str, Any] | None:
    """The Tune that holds the deployment now (the row's `tune_hold`): its id, what it
    holds, until when; None when none does."""
    hold = Deployment.objects.filter(pk=deployment_id).values_list("tune_hold", flat=True)
    found = next(iter(hold), None)
    return dict(found) if found else None


def _hold_take(run: TuneRun) -> None:
    """The deployment held by this Tune from now until its budget ends, then its restore
    (each candidate's start, and the restore's, bounded by deploy_timeout_s)."""
    rows = run.original.get("rows") or [{"replica": 0, "gpus": run.original["gpus"]}]
    now = timezone.now()
    until = now + timedelta(seconds=run.config.get("time_budget_s", 3600))
    restored_by = until + timedelta(seconds=run.config.get("deploy_timeout_s", 1800) + 2 * (
        settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S))
    gpus = ", ".join(str(g) for g in rows[0]["gpus"])
    if len(rows) > 1:
        holds = f"replica 0 (GPUs {gpus})"
        text = (f"replica 0 (GPUs {gpus}) is out of service for Tune #{run.pk} (its "
                f"candidates run in its place, out of the gateway's rotation) while replicas "
                f"1 to {len(rows) - 1} keep serving, until {until:%Y-%m-%d %H:%M} UTC at the "
                f"latest, restored by {restored_by:%H:%M} UTC")
    else:
        holds = f"the deployment (GPUs {gpus})"
        text = (f"the deployment is out of service for Tune #{run.pk} (its candidates run "
                f"in its place) until "
                f"{until:%Y-%m-%d %H:%M} UTC at the latest, then restored as it was (by "
                f"{restored_by:%H:%M} UTC)")
    Deployment.objects.filter(pk=run.original["id"]).update(tune_hold={
        "tune": run.pk, "holds": holds, "replica": 0, "gpus": rows[0]["gpus"],
        "serving": len(rows) - 1, "since": now.isoformat(), "until": until.isoformat(),
        "restored_by": restored_by.isoformat(), "text": text})


def _hold_give_back(run_id: int, deployment_id: int | None) -> None:
    if deployment_id is not None:
        Deployment.objects.filter(pk=deployment_id, tune_hold__tune=run_id).update(
            tune_hold={})


def tune_run(*, run_id: int) -> str:
    if not run_claim(TuneRun, run_id):
        return _resumed(run_id)
    run = TuneRun.objects.select_related("created_by").get(pk=run_id)
    config = run.config
    try:
        prompts = tune_prompts(config, run.prompts_text)
    except BenchmarkInputError as exc:
        run_finish(TuneRun, run_id, BenchmarkStatus.FAILED, error=str(exc))
        return "failed"
    if config.get("placement") == "side_by_side":
        if not _side_still_free(run):
            return "failed"
    else:
        _hold_take(run)
    candidates = [Candidate(c["name"], c["engine"]) for c in config["candidates"]]
    options = TuneOptions(levels=tuple(config["levels"]), warmup=config["warmup"],
                          time_budget_s=config["time_budget_s"],
                          lossless_max_tokens=config["lossless_max_tokens"],
                          threshold=config["threshold"], seed=config["seed"])
    progress, outcome = TuneProgress(), dict[str, Any]()
    deployer = deployer_for(run)
    held = (tune_hold(deployment_id=run.original["id"]) or {}).get("text") or (
        f"the deployment serves on while they run beside it, on GPUs "
        f"{run.config.get('side', {}).get('gpus')} (as {side_name(run)})")
    _note(run, f"Tune #{run.pk} began: {held}; its {len(candidates)} candidates run one "
          "after another")

    def work(cancel: threading.Event) -> None:
        try:
            outcome["result"] = run_tune(candidates, deployer, prompts,
                                         _lossless_prompts(config, prompts), options,
                                         progress, cancel)
        except Exception:  # run_tune restores and records; this is its own failure
            outcome["error"] = traceback.format_exc()
        finally:
            connection.close()

    run_polled(TuneRun, run_id, work, lambda: {**progress.snapshot(), "beat": _now()},
               name=f"tune-{run_id}")
    return _record(run, outcome, progress, deployer)


def _side_still_free(run: TuneRun) -> bool:
    """The GPUs chosen at create, or others free now of the same kind (another deployment
    may have taken them meanwhile); False when none are: the Tune failed, said why."""
    row = Deployment.objects.filter(pk=run.original["id"]).first()
    if row is None:
        run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, error="its deployment is gone")
        return False
    try:
        side = side_gpus(row)
    except BenchmarkInputError as exc:
        run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, error=str(exc.errors["placement"]))
        return False
    run.config = {**run.config, "side": side}
    TuneRun.objects.filter(pk=run.pk).update(config=run.config)
    return True


def lost_s() -> float:
    return float(settings.TUNE_LOST_S)


def _now() -> float:
    return round(time.time(), 1)


def _beat(run: TuneRun) -> float:
    """When the Tune's task last showed it lives: its last beat, else its start."""
    beat = (run.progress or {}).get("beat")
    if isinstance(beat, int | float):
        return float(beat)
    return run.started_at.timestamp() if run.started_at else 0.0


def _resumed(run_id: int) -> str:
    """The task delivered again for a Tune already running: while its worker beats, a
    duplicate, which leaves it alone; once its beat stopped (its worker was killed) or the
    sweep sent it again for that, the candidate it left deployed is taken down, the
    deployment restored, and the Tune ends saying so; never left holding the deployment.
    One copy takes it over (a conditional update of the progress it read)."""
    run = TuneRun.objects.filter(pk=run_id, status__in=[
        BenchmarkStatus.RUNNING, BenchmarkStatus.CANCELLING]).first()
    if run is None:
        return "not queued"
    progress = dict(run.progress or {})
    beat, resent = _beat(run), progress.get("resent")
    if time.time() - beat < lost_s() and not (isinstance(resent, int | float) and
                                              resent >= beat):
        return "running elsewhere"
    time.sleep(ALIVE_CHECK_S)  # a worker still alive beats meanwhile: the update below misses
    taken = {**progress, "phase": "restoring", "beat": _now(), "resumed": _now()}
    if not TuneRun.objects.filter(pk=run_id, progress=run.progress).update(progress=taken):
        return "taken over elsewhere"
    outcome: dict[str, Any] = {}

    def work(cancel: threading.Event) -> None:
        try:
            outcome["restored"] = {"ok": True, "message": deployer_for(run).restore()}
        except Exception as exc:
            outcome["restored"] = {"ok": False,
                                   "message": f"the deployment could not be restored: {exc}"}
        finally:
            connection.close()

    run_polled(TuneRun, run_id, work, lambda: {**taken, "beat": _now()},
               name=f"tune-{run_id}-restore")
    restored = outcome["restored"]
    run_finish(TuneRun, run_id, BenchmarkStatus.FAILED,
               results={**(run.results or {}), "restore": restored},
               error="the worker running this Tune stopped mid-run; the Tune ended and "
                     f"the deployment was restored: {restored['message']}")
    _hold_give_back(run_id, run.deployment_id)
    _note(run, f"Tune #{run.pk} ended (its worker stopped mid-run); {restored['message']}")
    return "failed"


def tune_sweep(*, now: float | None = None) -> list[str]:
    """Tunes whose task is gone (the panel loop, every 10 s): a running one
    whose beat stopped TUNE_LOST_S ago, or a queued one no worker took in QUEUED_LOST_S, is
    sent to the workers once more (the task, for a running one, restores the deployment and
    ends it); one no worker takes up in QUEUED_LOST_S even then is ended, saying why. What
    it did, in words."""
    now = time.time() if now is None else now
    said: list[str] = []
    for run in TuneRun.objects.filter(status__in=list(ACTIVE_STATUSES)):
        progress = dict(run.progress or {})
        resent = progress.get("resent")
        if run.status == BenchmarkStatus.QUEUED:
            since = run.created_at.timestamp()
            lost = "no worker took it"
        else:
            since = _beat(run)
            lost = "its worker stopped (no beat)"
        if now - since < (QUEUED_LOST_S if run.status == BenchmarkStatus.QUEUED else lost_s()):
            continue
        if not isinstance(resent, int | float) or resent < since:
            if TuneRun.objects.filter(pk=run.pk, progress=run.progress).update(
                    progress={**progress, "resent": now}):
                tasks.tune_run_later(run.pk)
                said.append(f"Tune #{run.pk}: {lost} for {now - since:.0f} s; sent to the "
                            "workers again")
            continue
        # Sent again: a worker (one restarting, say) has as long as a queued Tune to take it.
        if now - resent >= QUEUED_LOST_S:
            said.append(_ended_lost(run, lost, now - since))
    return said


def _ended_lost(run: TuneRun, lost: str, waited: float) -> str:
    """The Tune ended after no worker took it up again: a queued one never touched the
    deployment; a running one leaves it where its worker stopped, said on the Tune and in
    the deployment's log, and gives up its hold (the operator can act on it)."""
    if run.status == BenchmarkStatus.QUEUED:
        why = (f"no worker took this Tune in {waited:.0f} s, even when sent again (its task "
               "message was lost, or no worker consumes the bench queue); the deployment "
               "was never touched")
        ended = bool(TuneRun.objects.filter(pk=run.pk, status=BenchmarkStatus.QUEUED).update(
            status=BenchmarkStatus.FAILED, finished_at=timezone.now(), error=why))
    else:
        row = Deployment.objects.filter(pk=run.original.get("id")).first()
        where = ("gone" if row is None else
                 "on its own spec" if row.spec == run.original.get("spec") else
                 f"{row.status} on a candidate's spec: Redeploy it with its own spec")
        if run.config.get("placement") == "side_by_side":
            where += (f", and its side deployment {side_name(run)} as it was: Stop and "
                      "Delete it")
        why = (f"{lost} for {waited:.0f} s and no worker took it up again to restore the "
               f"deployment; it was left {where}")
        ended = run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, error=why, results={
            **(run.results or {}), "restore": {"ok": False, "message": why}})
        if ended and row is not None:
            Deployment.objects.filter(pk=row.pk, spec=run.original.get("spec")).update(
                draining=False)
    if ended:
        _hold_give_back(run.pk, run.deployment_id)
        _note(run, f"Tune #{run.pk} ended: {why}")
    return f"Tune #{run.pk}: {why}"


def _record(run: TuneRun, outcome: dict[str, Any], progress: TuneProgress,
            deployer: PanelDeployer) -> str:
    snapshot = progress.snapshot()
    if "error" in outcome:
        run_finish(TuneRun, run.pk, BenchmarkStatus.FAILED, progress=snapshot,
                   error=outcome["error"][-4000:])
        _hold_give_back(run.pk, run.deployment_id)
        return "failed"
    result = outcome["result"]
    results = {**result.to_dict(),
               "simulator": any(image_is_simulator(image=i) for i in deployer.images)}
    restore = result.restore
    status = {"done": BenchmarkStatus.DONE, "cancelled": BenchmarkStatus.CANCELLED}.get(
        result.ended, BenchmarkStatus.FAILED)
    error = result.reason if result.ended != "done" else ""
    if not restore["ok"]:
        status = BenchmarkStatus.FAILED
        error = f"{error}; {restore['message']}" if error else restore["message"]
    run_finish(TuneRun, run.pk, status, progress=snapshot, results=results, error=error)
    _hold_give_back(run.pk, run.deployment_id)
    _note(run, f"Tune #{run.pk} ended ({result.ended}"
          f"{': ' + result.reason.splitlines()[-1] if result.reason else ''}); "
          f"{restore['message']}")
    return str(status)


def _note(run: TuneRun, message: str) -> None:
    """A line in the deployment's own event log (its page's timeline, its events API)."""
    if run.deployment_id is not None:
        deployments.events_append(deployment_id=run.deployment_id,
                                  events=[(EventKind.STATUS, {"message": message[:500]})])
