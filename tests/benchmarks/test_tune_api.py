"""Tune's REST API, pages and CLI without engines: a Tune is refused with a 400 naming the
field (a deployment not ready, in a rolling change, already tuning; bad levels; a bad
candidate), nothing stored then; a deployment with replicas is tuned on replica 0 (its rows
kept in `original`); viewers get 403 (Tune takes a deployment out of service); the queued
run says its candidates; a queued Tune cancelled ends at once; the export of a Tune measured
on paced engines (appliance.tune.paced) gives a CSV row per candidate and level; Apply only
of a finished Tune and a candidate it recommends; `appliance tune` names the refused field."""

from __future__ import annotations

import csv
import io
import time
from typing import Any
from unittest import mock

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from appliance.bench.prompts import Prompt
from appliance.cli import main as cli_main
from appliance.tune import BASELINE, TuneOptions, default_candidates, run_tune
from appliance.tune.paced import Pace, PacedDeployer
from tests.specs import spec
from web import tasks
from web.benchmarks import tune_applying, tune_task
from web.benchmarks.tune_models import TuneRun
from web.deployments.models import Deployment, DeploymentStatus
from web.fleet.leases import gpu_leases_acquire

pytestmark = pytest.mark.django_db(transaction=True)


def _deployment(name: str = "kimi", status: str = DeploymentStatus.READY,
                **changes: Any) -> Deployment:
    return Deployment.objects.create(
        name=name, spec=spec(name=name, **changes), recipe="r", algorithm="DDTREE",
        status=status, engine_url="http://127.0.0.1:9", image="img:1", gpus=[0])


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _create(user: Any, path: str = "/api/tunes/", **body: Any) -> Any:
    with mock.patch.object(tasks, "tune_run_later") as enqueue:
        response = _api(user).post(path, body, format="json")
    response.enqueued = enqueue.call_args_list  # type: ignore[attr-defined]
    return response


def test_a_tune_is_queued_with_its_candidates(operator) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    r = _create(operator, f"/api/deployments/{row.pk}/tune/", levels=[8, 1],
                candidates=["dflash", "ddtree-8"],
                extra_candidates=[{"name": "dflash-bs16",
                                   "engine": {"speculative_num_draft_tokens": 16}}])
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "queued" and body["deployment"] == row.pk
    assert body["config"]["levels"] == [1, 8]
    assert [c["name"] for c in body["config"]["candidates"]] == [
        BASELINE, "dflash", "ddtree-8", "dflash-bs16"]
    assert body["original"]["spec"] == row.spec and body["original"]["gpus"] == [0]
    assert len(r.enqueued) == 1
    listed = _api(operator).get(f"/api/deployments/{row.pk}/tune/").json()
    assert [t["id"] for t in listed] == [body["id"]]
    # A second Tune of the same deployment while one is queued: refused.
    again = _create(operator, "/api/tunes/", deployment=row.pk)
    assert again.status_code == 400 and "under way" in again.json()["deployment"][0]
    cancelled = _api(operator).post(f"/api/tunes/{body['id']}/cancel/").json()
    assert cancelled["status"] == "cancelled"


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"levels": [0]}, "levels", "greater than or equal to 1"),
    ({"levels": [1, 2, 3, 4, 5, 6, 7, 8, 9]}, "levels", "no more than 8"),
    ({"candidates": ["eagle"]}, "candidates", "unknown candidates ['eagle']"),
    ({"extra_candidates": [{"name": "x", "engine": {"model_path": "/other"}}]},
     "candidates[0].engine", "keeps ['model_path']"),
    ({"extra_candidates": [{"name": "Bad Name", "engine": {}}]}, "candidates[0].name",
     "lowercase"),
    ({"prompt_source": "jsonl"}, "prompts", "upload a jsonl file"),
    ({"time_budget_s": 5}, "time_budget_s", "60"),
])
def test_bad_input_is_a_400_naming_the_field(operator, body, field, words) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    r = _create(operator, deployment=row.pk, **body)
    assert r.status_code == 400, r.content
    assert words in str(r.json()[field]), r.json()
    assert not TuneRun.objects.exists() and not r.enqueued


def test_only_a_ready_deployment_is_tuned(operator, viewer) -> None:  # type: ignore[no-untyped-def]
    stopped = _deployment("off", status=DeploymentStatus.STOPPED)
    r = _create(operator, deployment=stopped.pk)
    assert r.status_code == 400 and "is stopped" in r.json()["deployment"][0]
    rolling = _deployment("rolls")
    Deployment.objects.filter(pk=rolling.pk).update(rolling={
        "state": "rolling", "text": "rolling restart: replica 1 of 2: stopping"})
    r = _create(operator, deployment=rolling.pk)
    assert r.status_code == 400 and "in a rolling change (rolling restart: replica 1 of 2" in r.json(
        )["deployment"][0]
    assert _create(operator, deployment=999999).status_code == 400
    ready = _deployment("ready")
    assert _create(viewer, deployment=ready.pk).status_code == 403
    assert _api(viewer).get("/api/tunes/").status_code == 403
    assert not TuneRun.objects.exists()


def test_a_deployment_with_replicas_is_tuned_on_replica_0(operator) -> None:  # type: ignore[no-untyped-def]
    many = _deployment("many", replicas=2)
    other = Deployment.objects.create(
        name="many", spec=many.spec, recipe="r", algorithm="DDTREE", gpus=[1],
        status=DeploymentStatus.READY, replica_of=many, replica_index=1, host="h1")
    r = _create(operator, deployment=many.pk, candidates=["dflash"])
    assert r.status_code == 201, r.content
    original = r.json()["original"]
    assert original["replicas"] == 2 and original["gpus"] == [0]
    assert [(x["id"], x["replica"], x["gpus"], x["host"]) for x in original["rows"]] == [
        (many.pk, 0, [0], ""), (other.pk, 1, [1], "h1")]
    assert len(r.enqueued) == 1
    # A replica row itself is not tuned: its replica 0 is.
    r = _create(operator, deployment=other.pk)
    assert r.status_code == 400 and f"tune #{many.pk}" in r.json()["deployment"][0]


def _measured(row: Deployment) -> TuneRun:
    """A Tune whose results are a real run over paced engines (the deployment's own spec's
    candidates: the baseline, DFLASH and a DDTREE budget)."""
    cands = {c.name: c for c in default_candidates(row.engine_options)}
    paces = {BASELINE: Pace(0.01, 1.0, 0.01), "dflash": Pace(0.012, 2.6, 0.15, True),
             "ddtree-8": Pace(0.014, 3.6, 0.35, True)}
    deployer = PacedDeployer(paces, original="ddtree-8")
    try:
        result = run_tune([cands[n] for n in paces], deployer,
                          [Prompt(f"q{i}", 8, 8) for i in range(4)], ["a", "b"],
                          TuneOptions(levels=(1, 4), warmup=0, time_budget_s=60))
    finally:
        deployer.close()
    return TuneRun.objects.create(
        deployment=row, status="done", original={"id": row.pk, "spec": row.spec},
        config={"candidates": [cands[n].to_dict() for n in paces]},
        results={**result.to_dict(), "simulator": True})


def test_the_export_has_a_row_per_candidate_and_level(operator) -> None:  # type: ignore[no-untyped-def]
    run = _measured(_deployment())
    text = _api(operator).get(f"/api/tunes/{run.pk}/export.csv/").content.decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {(r["candidate"], r["concurrency"]) for r in rows} == {
        (c, str(level)) for c in (BASELINE, "dflash", "ddtree-8") for level in (1, 4)}
    assert {r["lossless"] for r in rows} == {"baseline", "passed"}
    assert all(r["simulator"] == "True" for r in rows)
    chosen = {r["concurrency"]: r["candidate"] for r in rows if r["recommended"] == "True"}
    per_level = run.results["recommendation"]["per_level"]
    assert chosen == {str(e["concurrency"]): e["candidate"] for e in per_level}
    assert all(float(r["output_throughput"]) > 0 and float(r["tpot_ms_p99"]) > 0 for r in rows)
    exported = _api(operator).get(f"/api/tunes/{run.pk}/export.json/")
    assert exported["Content-Disposition"] == f'attachment; filename="tune-{run.pk}.json"'
    assert exported.json()["recommended"] == tune_applying.recommended(run)


def test_apply_takes_a_finished_tune_and_a_candidate_it_recommends(operator) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    run = _measured(row)
    bad = _api(operator).post(f"/api/tunes/{run.pk}/apply/", {"candidate": "ddtree-32"},
                              format="json")
    assert bad.status_code == 400 and "choose one the Tune recommends" in bad.json()[
        "candidate"][0]
    with mock.patch.object(tasks, "tune_apply_later") as enqueue:
        ok = _api(operator).post(f"/api/tunes/{run.pk}/apply/", {}, format="json")
    assert ok.status_code == 202, ok.content
    assert ok.json()["applied"]["candidate"] == tune_applying.recommended(run)
    assert ok.json()["applied"]["state"] == "queued" and len(enqueue.call_args_list) == 1
    TuneRun.objects.filter(pk=run.pk).update(status="cancelled", applied={})
    late = _api(operator).post(f"/api/tunes/{run.pk}/apply/", {}, format="json")
    assert late.status_code == 400 and "only a finished Tune" in late.json()["status"][0]


def test_the_pages_show_the_form_and_the_run(operator, client) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    run = _measured(row)
    client.force_login(operator)
    form = client.get(f"/benchmarks/tunes/new/?deployment={row.pk}").content.decode()
    assert 'id="id_placement"' in form and '<option value="side_by_side">' in form
    for name in (BASELINE, "dflash", "ddtree-8", "ddtree-16", "ddtree-32"):
        assert f'id="cand-{name}"' in form
    page = client.get(f"/benchmarks/tunes/{run.pk}/").content.decode()
    assert 'id="chart-throughput"' in page and f"/api/tunes/{run.pk}/export.csv/" in page
    assert 'id="tunes"' in client.get("/benchmarks/").content.decode()
    listing = client.get("/benchmarks/tunes/").content.decode()
    assert run.results["recommendation"]["summary"] in listing


def test_the_cli_names_the_refused_field(operator, token_for, live_server, capsys) -> None:  # type: ignore[no-untyped-def]
    stopped = _deployment("off", status=DeploymentStatus.STOPPED)
    code = cli_main(["tune", str(stopped.pk), "--panel", live_server.url,
                     "--token", token_for(operator)])
    assert code == 2
    err = capsys.readouterr().err
    assert "HTTP 400" in err and '"deployment"' in err and "is stopped" in err
    assert cli_main(["tune", str(stopped.pk), "--panel", live_server.url, "--token", ""]) == 2
    # Side by side where no GPU is free: the 400 names `placement`.
    ready = _deployment("full")
    gpu_leases_acquire(deployment=ready)
    with override_settings(GPU_COUNT=1):
        code = cli_main(["tune", str(ready.pk), "--side-by-side", "--panel", live_server.url,
                         "--token", token_for(operator)])
    assert code == 2
    err = capsys.readouterr().err
    assert '"placement"' in err and "side by side needs 1 free GPU" in err


def test_a_tune_delivered_again_after_its_worker_died_ends_and_restores() -> None:
    """The task comes again for a Tune already running (its worker was killed mid-run): the
    Tune ends, saying so and how the deployment was restored; never left holding it."""
    row = _deployment()
    run = TuneRun.objects.create(deployment=row, status="running",
                                 original={"id": row.pk, "name": "kimi#1", "spec": row.spec,
                                           "gpus": [0], "served_model": "kimi"},
                                 config={"deploy_timeout_s": 30})
    Deployment.objects.filter(pk=row.pk).update(tune_hold={"tune": run.pk, "text": "held"})
    assert tune_task.tune_hold(deployment_id=row.pk) == {"tune": run.pk, "text": "held"}
    assert tune_task.tune_run(run_id=run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == "failed" and run.error.startswith(
        "the worker running this Tune stopped mid-run; the Tune ended")
    assert run.results["restore"] == {"ok": True, "message": "kimi#1 still serves its own "
                                      "spec; nothing to restore"}
    assert tune_task.tune_hold(deployment_id=row.pk) is None
    assert tune_task.tune_run(run_id=run.pk) == "not queued"


def _held(row: Deployment, **fields: Any) -> TuneRun:
    run = TuneRun.objects.create(
        deployment=row, original={"id": row.pk, "name": f"{row.name}#{row.pk}",
                                  "spec": row.spec, "gpus": [0], "served_model": row.name},
        config={"deploy_timeout_s": 30, "time_budget_s": 600}, **fields)
    Deployment.objects.filter(pk=row.pk).update(tune_hold={
        "tune": run.pk, "holds": "the deployment (GPUs 0)", "until": "2026-01-01T00:00:00",
        "text": f"the deployment is out of service for Tune #{run.pk}"})
    return run


def test_the_detail_api_says_which_tune_holds_the_deployment(operator) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    assert _api(operator).get(f"/api/deployments/{row.pk}/").json()["tune_hold"] == {}
    run = _held(row, status="running")
    body = _api(operator).get(f"/api/deployments/{row.pk}/").json()
    assert body["tune_hold"]["tune"] == run.pk and body["tune_hold"]["until"]
    assert body["tune_hold"]["holds"] == "the deployment (GPUs 0)"
    assert _api(operator).get(f"/api/tunes/{run.pk}/").json()["hold"]["tune"] == run.pk


def test_the_sweep_ends_a_queued_tune_no_worker_took(operator) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    r = _create(operator, deployment=row.pk, candidates=["dflash"])
    run = TuneRun.objects.get(pk=r.json()["id"])
    born = run.created_at.timestamp()
    assert tune_task.tune_sweep(now=born + 5) == []  # within its bound: waiting
    with mock.patch.object(tasks, "tune_run_later") as resend:
        said = tune_task.tune_sweep(now=born + tune_task.QUEUED_LOST_S + 1)
        assert [c.args for c in resend.call_args_list] == [(run.pk,)]
        assert "no worker took it" in said[0] and "sent to the workers again" in said[0]
        # Sent once: not again before its bound, then ended.
        assert tune_task.tune_sweep(now=born + tune_task.QUEUED_LOST_S + 5) == []
        said = tune_task.tune_sweep(now=born + 2 * tune_task.QUEUED_LOST_S + 2)
        assert len(resend.call_args_list) == 1
    run.refresh_from_db()
    assert run.status == "failed" and "no worker took this Tune" in run.error, run.error
    assert "the deployment was never touched" in run.error and said == [
        f"Tune #{run.pk}: {run.error}"]
    after = Deployment.objects.get(pk=row.pk)
    assert after.spec == row.spec and after.status == "ready" and after.tune_hold == {}
    # The late message, should it come, finds nothing to do.
    assert tune_task.tune_run(run_id=run.pk) == "not queued"


def test_the_sweep_has_a_running_tune_whose_worker_died_restored_and_ended() -> None:
    row = _deployment()
    now = time.time()
    alive = _held(row, status="running", progress={"beat": now - 5})
    # Its worker beats: the sweep leaves it, and a duplicate delivery leaves it too.
    assert tune_task.tune_sweep(now=now) == []
    assert tune_task.tune_run(run_id=alive.pk) == "running elsewhere"
    TuneRun.objects.filter(pk=alive.pk).update(progress={"beat": now - tune_task.lost_s()})
    with mock.patch.object(tasks, "tune_run_later") as resend:
        said = tune_task.tune_sweep(now=now + 1)
    assert [c.args for c in resend.call_args_list] == [(alive.pk,)]
    assert "its worker stopped (no beat)" in said[0]
    # The message sent again: its task restores the deployment and ends the Tune.
    assert tune_task.tune_run(run_id=alive.pk) == "failed"
    alive.refresh_from_db()
    assert alive.status == "failed" and alive.results["restore"]["ok"] is True
    assert "stopped mid-run" in alive.error and alive.progress["phase"] == "restoring"
    assert tune_task.tune_hold(deployment_id=row.pk) is None


def test_the_sweep_ends_a_running_tune_no_worker_takes_up_again() -> None:
    row = _deployment()
    now = time.time()
    run = _held(row, status="cancelling", progress={"beat": now - tune_task.lost_s() - 1})
    with mock.patch.object(tasks, "tune_run_later") as resend:
        tune_task.tune_sweep(now=now)
        assert tune_task.tune_sweep(now=now + tune_task.QUEUED_LOST_S - 1) == []
        said = tune_task.tune_sweep(now=now + tune_task.QUEUED_LOST_S)
    assert len(resend.call_args_list) == 1
    run.refresh_from_db()
    assert run.status == "failed" and said == [f"Tune #{run.pk}: {run.error}"]
    assert "no worker took it up again" in run.error and "left on its own spec" in run.error
    assert run.results["restore"]["ok"] is False
    assert tune_task.tune_hold(deployment_id=row.pk) is None


def test_side_by_side_takes_free_gpus_of_the_kind_and_never_held_ones(operator) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    gpu_leases_acquire(deployment=row)  # GPU 0
    other = _deployment("other")
    Deployment.objects.filter(pk=other.pk).update(gpus=[1])
    other.refresh_from_db()
    gpu_leases_acquire(deployment=other)  # GPU 1
    with override_settings(GPU_COUNT=2):
        r = _create(operator, deployment=row.pk, placement="side_by_side")
    assert r.status_code == 400, r.content
    said = r.json()["placement"][0]
    assert "side by side needs 1 free GPU of the kind unnamed" in said
    assert f"GPU 0: kimi #{row.pk}" in said and f"GPU 1: other #{other.pk}" in said
    assert "Run it in_place" in said and not TuneRun.objects.exists() and not r.enqueued
    assert _create(operator, deployment=row.pk, placement="beside").status_code == 400
    with override_settings(GPU_COUNT=4):
        r = _create(operator, deployment=row.pk, placement="side_by_side")
    assert r.status_code == 201, r.content
    assert r.json()["config"]["placement"] == "side_by_side"
    assert r.json()["config"]["side"]["gpus"] == [2]
