"""Tune's REST API, pages and CLI without engines: a Tune is refused with a 400 naming the
field (a deployment not ready, with replicas, already tuning; bad levels; a bad candidate),
nothing stored then; viewers get 403 (Tune takes a deployment out of service); the queued
run says its candidates; a queued Tune cancelled ends at once; the export of a Tune measured
on paced engines (appliance.tune.paced) gives a CSV row per candidate and level; Apply only
of a finished Tune and a candidate it recommends; `appliance tune` names the refused field."""

from __future__ import annotations

import csv
import io
from typing import Any
from unittest import mock

import pytest
from rest_framework.test import APIClient

from appliance.bench.prompts import Prompt
from appliance.cli import main as cli_main
from appliance.tune import BASELINE, TuneOptions, default_candidates, run_tune
from appliance.tune.paced import Pace, PacedDeployer
from tests.specs import spec
from web import tasks
from web.benchmarks import tune_services
from web.benchmarks.tune_models import TuneRun
from web.deployments.models import Deployment, DeploymentStatus

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


def test_only_a_ready_single_replica_deployment_is_tuned(operator, viewer) -> None:  # type: ignore[no-untyped-def]
    stopped = _deployment("off", status=DeploymentStatus.STOPPED)
    r = _create(operator, deployment=stopped.pk)
    assert r.status_code == 400 and "is stopped" in r.json()["deployment"][0]
    many = _deployment("many", replicas=2)
    Deployment.objects.create(name="many", spec=many.spec, recipe="r", algorithm="DDTREE",
                              status=DeploymentStatus.READY, replica_of=many, replica_index=1)
    r = _create(operator, deployment=many.pk)
    assert r.status_code == 400 and "scale it to 1 replica" in r.json()["deployment"][0]
    assert _create(operator, deployment=999999).status_code == 400
    ready = _deployment("ready")
    assert _create(viewer, deployment=ready.pk).status_code == 403
    assert _api(viewer).get("/api/tunes/").status_code == 403
    assert not TuneRun.objects.exists()


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
    assert exported.json()["recommended"] == tune_services.recommended(run)


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
    assert ok.json()["applied"]["candidate"] == tune_services.recommended(run)
    assert ok.json()["applied"]["state"] == "queued" and len(enqueue.call_args_list) == 1
    TuneRun.objects.filter(pk=run.pk).update(status="cancelled", applied={})
    late = _api(operator).post(f"/api/tunes/{run.pk}/apply/", {}, format="json")
    assert late.status_code == 400 and "only a finished Tune" in late.json()["status"][0]


def test_the_pages_show_the_form_and_the_run(operator, client) -> None:  # type: ignore[no-untyped-def]
    row = _deployment()
    run = _measured(row)
    client.force_login(operator)
    form = client.get(f"/benchmarks/tunes/new/?deployment={row.pk}").content.decode()
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


def test_a_tune_delivered_again_after_its_worker_died_ends_and_restores() -> None:
    """The task comes again for a Tune already running (its worker was killed mid-run): the
    Tune ends, saying so and how the deployment was restored; never left holding it."""
    row = _deployment()
    run = TuneRun.objects.create(deployment=row, status="running",
                                 original={"id": row.pk, "name": "kimi#1", "spec": row.spec,
                                           "gpus": [0], "served_model": "kimi"},
                                 config={"deploy_timeout_s": 30})
    assert tune_services.tune_hold(deployment_id=row.pk) is not None
    assert tune_services.tune_run(run_id=run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == "failed" and run.error.startswith(
        "the worker running this Tune stopped mid-run; the Tune ended")
    assert run.results["restore"] == {"ok": True, "message": "kimi#1 still serves its own "
                                      "spec; nothing to restore"}
    assert tune_services.tune_hold(deployment_id=row.pk) is None
    assert tune_services.tune_run(run_id=run.pk) == "not queued"
