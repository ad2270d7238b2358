"""Tune on the production road: the Celery worker, the engine agent and the panel loop
(processes, on the test database and Redis) and the test engine in Docker. A Tune of three candidates at two
levels measures each on the deployment's own GPU, checks them lossless, recommends, and
leaves the deployment as it was; Apply redeploys it with the winner; a Tune cancelled
midway restores the deployment (spec, GPUs, served name, its row and so its keys)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.specs import spec
from tests.waiting import wait_for_status
from tests.worker.stack import fast_engines, until, worker_agent_loop
from web.benchmarks import tune_applying, tune_deployers, tune_services, tune_task
from web.benchmarks.tune_models import TuneRun
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus, Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
FAST = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "2", "TEST_ENGINE_TOKEN_S": "0.004"}
CONFIG = {"levels": [1, 4], "num_prompts": 8, "output_len": 24, "prompt_source": "builtin",
          "warmup": 1, "time_budget_s": 900, "deploy_timeout_s": 120, "lossless_prompts": 3,
          "lossless_max_tokens": 12}


@pytest.fixture
def env(test_engine_image: str) -> Iterator[dict[str, str]]:  # noqa: F811
    with fast_engines(test_engine_image, FAST) as variables:
        yield variables


def _until(check: Any, what: Any, timeout_s: float = 240) -> Any:
    return until(check, what, timeout_s, poll_s=0.2)


def _run(pk: int) -> TuneRun:
    return TuneRun.objects.get(pk=pk)


def _as_was(row: Deployment, before: dict[str, Any]) -> None:
    assert row.status == S.READY and row.engine_url
    assert row.spec == before["spec"] and row.gpus == before["gpus"]
    assert row.algorithm == before["algorithm"] and row.name == before["name"]


def test_tune_recommends_applies_and_a_cancelled_one_restores(env: dict[str, str],
                                                              tmp_path: Path) -> None:
    with worker_agent_loop(tmp_path, env):
        row = deploying.deployment_create(data=spec(), confirm_warnings=True)
        assert wait_for_status(row.pk, {S.READY, S.FAILED}, 120) == S.READY
        row.refresh_from_db()
        before = {"spec": row.spec, "gpus": row.gpus, "algorithm": row.algorithm,
                  "name": row.name}

        run = tune_services.tune_create(deployment_id=row.pk, config=dict(CONFIG),
                                        candidates=["dflash", "ddtree-8"])
        # While it runs the deployment is out of service, and says until when.
        _until(lambda: tune_task.tune_hold(deployment_id=row.pk), "the Tune holds it")
        hold = tune_task.tune_hold(deployment_id=row.pk)
        assert hold is not None and "out of service for Tune" in hold["text"]
        _until(lambda: not _run(run.pk).is_active, lambda: (
            f"the Tune ends: {_run(run.pk).progress}; the worker's log: "
            f"{(tmp_path / 'worker.log').read_text()[-3000:]}"), timeout_s=400)
        run = _run(run.pk)
        assert run.status == "done", (run.error, run.results.get("reason"))
        states = {c["name"]: c["state"] for c in run.results["candidates"]}
        assert states == {"none": "measured", "dflash": "measured", "ddtree-8": "measured"}
        assert {(r["candidate"], r["concurrency"]) for r in run.results["rows"]} == {
            (c, level) for c in states for level in (1, 4)}
        assert all(r["completed"] == 8 and not r["errors"] for r in run.results["rows"])
        lossless = {c["name"]: c["lossless"] for c in run.results["candidates"]}
        assert lossless["dflash"]["passed"] is True and lossless["ddtree-8"]["passed"] is True
        assert lossless["dflash"]["total"] == 3
        rec = run.results["recommendation"]
        assert [e["concurrency"] for e in rec["per_level"]] == [1, 4]
        assert all(e["candidate"] in states for e in rec["per_level"])
        assert run.results["restore"]["ok"] is True
        _as_was(Deployment.objects.get(pk=row.pk), before)
        assert tune_task.tune_hold(deployment_id=row.pk) is None
        said = [e.payload["message"] for e in Event.objects.filter(
            deployment_id=row.pk, kind="status", payload__message__startswith=f"Tune #{run.pk}")]
        assert len(said) == 2 and "out of service" in said[0] and "ended (done)" in said[1]

        # Apply: the winner's spec on the deployment, started again.
        winner = tune_applying.recommended(run)
        assert winner is not None
        tune_applying.tune_apply(run=run)
        _until(lambda: _run(run.pk).applied.get("state") in ("done", "failed"),
               lambda: f"the apply ends: {_run(run.pk).applied}")
        assert _run(run.pk).applied["state"] == "done", _run(run.pk).applied
        applied = Deployment.objects.get(pk=row.pk)
        want = next(c for c in run.config["candidates"] if c["name"] == winner)
        assert applied.status == S.READY
        assert applied.algorithm == want["algorithm"]
        for key, value in want["engine"].items():  # its cleared options too (None)
            assert applied.spec["engine"].get(key) == value, (key, applied.spec["engine"])
        assert applied.gpus == before["gpus"] and applied.name == before["name"]

        # A Tune cancelled while its second candidate runs: the deployment as it was then.
        before = {"spec": applied.spec, "gpus": applied.gpus, "algorithm": applied.algorithm,
                  "name": applied.name}
        # (long answers: a level lasts seconds, many times the cancel's poll). Its two
        # speculative candidates name the drafter themselves: where the baseline won and was
        # applied, the deployment's spec no longer has one (the baseline clears it), and
        # the default candidates, made from that spec, would be skipped.
        engine = spec()["engine"]
        drafter = {key: engine[key] for key in ("speculative_draft_model_path",
                                                "speculative_num_draft_tokens")}
        second = tune_services.tune_create(
            deployment_id=row.pk, candidates=["dflash-again", "ddtree-again"],
            extra_candidates=[
                {"name": "dflash-again", "engine": drafter},
                {"name": "ddtree-again", "engine": {
                    **drafter, "speculative_algorithm": "DDTREE",
                    "speculative_ddtree_budget": 8}}],
            config={**CONFIG, "levels": [4], "output_len": 2000})
        _until(lambda: ((p := _run(second.pk).progress or {}).get("index"), p.get("phase")) == (
            2, "benchmark"), lambda: f"the second candidate measured: {_run(second.pk).progress}"
            f"; its candidates: {_run(second.pk).results.get('candidates')}")
        tune_services.tune_request_cancel(run=_run(second.pk))
        _until(lambda: not _run(second.pk).is_active,
               lambda: f"the cancel ends it: {_run(second.pk).progress}", timeout_s=200)
        second = _run(second.pk)
        assert second.status == "cancelled", (second.error, second.results.get("seconds"), [
            (c["name"], c["state"]) for c in second.results.get("candidates", [])])
        assert second.error.startswith("cancelled by the operator during ")
        assert second.results["restore"]["ok"] is True
        assert second.results["candidates"][-1]["state"] == "not run"
        _as_was(Deployment.objects.get(pk=row.pk), before)


def _rows(pk: int) -> list[Deployment]:
    return [Deployment.objects.get(pk=pk), *Deployment.objects.filter(
        replica_of_id=pk).order_by("replica_index")]


def _kept(row: Deployment) -> dict[str, Any]:
    return {"spec": row.spec, "gpus": row.gpus, "algorithm": row.algorithm, "name": row.name,
            "host": row.host, "status": row.status, "served": row.engine_options.get(
                "served_model_name")}


def test_a_deployment_with_replicas_is_tuned_on_replica_0_and_applied_rolling(
        env: dict[str, str], tmp_path: Path) -> None:
    """Replica 0 runs the candidates, drained, while replica 1 keeps serving its own run
    untouched; then every row is as it was; Apply rolls the winner over both replicas."""
    with worker_agent_loop(tmp_path, env):
        first = deploying.deployment_create(data=spec(gpus=[0], replicas=2),
                                            confirm_warnings=True)
        rows = _rows(first.pk)
        for row in rows:
            assert wait_for_status(row.pk, {S.READY, S.FAILED}, 120) == S.READY
        rows = _rows(first.pk)
        before = [_kept(r) for r in rows]
        other_run = rows[1].run

        # (answers long enough that the candidate is seen measuring, many polls)
        run = tune_services.tune_create(deployment_id=first.pk, candidates=["dflash"],
                                        config={**CONFIG, "levels": [1], "output_len": 300})
        _until(lambda: tune_task.tune_hold(deployment_id=first.pk), "the Tune holds it")
        hold = tune_task.tune_hold(deployment_id=first.pk)
        assert hold is not None and hold["tune"] == run.pk and hold["serving"] == 1
        assert hold["text"].startswith("replica 0 (GPUs 0) is out of service for Tune")
        assert "replicas 1 to 1 keep serving" in hold["text"]
        # While the candidate runs on replica 0 (out of the rotation), replica 1 serves on.
        _until(lambda: ((p := _run(run.pk).progress or {}).get("index"), p.get("phase")) == (
            2, "benchmark"), lambda: f"the candidate measured: {_run(run.pk).progress}")
        zero, one = _rows(first.pk)
        assert zero.draining and not one.draining and zero.algorithm == "DFLASH"
        assert one.status == S.READY and one.run == other_run and one.algorithm == "DDTREE"
        _until(lambda: not _run(run.pk).is_active, lambda: (
            f"the Tune ends: {_run(run.pk).progress}; the worker's log: "
            f"{(tmp_path / 'worker.log').read_text()[-3000:]}"), timeout_s=400)
        run = _run(run.pk)
        assert run.status == "done", (run.error, run.results.get("reason"))
        assert {c["name"]: c["state"] for c in run.results["candidates"]} == {
            "none": "measured", "dflash": "measured"}
        assert run.results["restore"]["ok"] is True
        after = _rows(first.pk)
        assert [_kept(r) for r in after] == before
        assert after[1].run == other_run  # never stopped
        assert not any(r.draining for r in after)
        assert tune_task.tune_hold(deployment_id=first.pk) is None

        # Apply: a rolling redeploy, one replica at a time, followed to its end.
        winner = tune_applying.recommended(run)
        assert winner is not None
        tune_applying.tune_apply(run=run)
        _until(lambda: _run(run.pk).applied.get("state") in ("done", "failed"),
               lambda: f"the apply ends: {_run(run.pk).applied}", timeout_s=300)
        applied = _run(run.pk).applied
        assert applied["state"] == "done", applied
        assert "rolling redeploy done: 2 of 2 replicas" in applied["message"]
        want = next(c for c in run.config["candidates"] if c["name"] == winner)
        rolled = _rows(first.pk)
        for row, was in zip(rolled, before, strict=True):
            assert row.status == S.READY and row.algorithm == want["algorithm"]
            assert row.gpus == was["gpus"] and row.name == was["name"]
            for key, value in want["engine"].items():
                assert row.spec["engine"].get(key) == value, (key, row.spec["engine"])
        assert rolled[1].run == other_run + 1

        # A Tune cancelled while replica 0 measures its candidate: every row as it was then.
        before = [_kept(r) for r in rolled]
        second = tune_services.tune_create(deployment_id=first.pk, candidates=["ddtree-8"],
                                           config={**CONFIG, "levels": [4], "output_len": 2000})
        _until(lambda: ((p := _run(second.pk).progress or {}).get("index"), p.get("phase")) == (
            2, "benchmark"), lambda: f"the candidate measured: {_run(second.pk).progress}")
        tune_services.tune_request_cancel(run=_run(second.pk))
        _until(lambda: not _run(second.pk).is_active,
               lambda: f"the cancel ends it: {_run(second.pk).progress}", timeout_s=200)
        second = _run(second.pk)
        assert second.status == "cancelled" and second.results["restore"]["ok"] is True
        after = _rows(first.pk)
        assert [_kept(r) for r in after] == before and after[1].run == rolled[1].run
        assert not any(r.draining for r in after)
        assert tune_task.tune_hold(deployment_id=first.pk) is None


def test_side_by_side_runs_beside_on_free_gpus_and_leaves_the_deployment_serving(
        env: dict[str, str], tmp_path: Path) -> None:
    """The candidates run as a deployment of their own on a free GPU while the deployment
    serves on (same run, no hold); at the end that side deployment is gone."""
    with worker_agent_loop(tmp_path, env):
        row = deploying.deployment_create(data=spec(gpus=[0]), confirm_warnings=True)
        assert wait_for_status(row.pk, {S.READY, S.FAILED}, 120) == S.READY
        row.refresh_from_db()
        before, served_run = _kept(row), row.run

        run = tune_services.tune_create(
            deployment_id=row.pk, candidates=["dflash"],
            config={**CONFIG, "levels": [1], "output_len": 300, "placement": "side_by_side"})
        assert run.config["side"]["gpus"] == [1]
        side = tune_deployers.side_name(run)
        _until(lambda: ((p := _run(run.pk).progress or {}).get("index"), p.get("phase")) == (
            2, "benchmark"), lambda: f"the candidate measured: {_run(run.pk).progress}")
        beside = Deployment.objects.get(name=side)
        assert beside.gpus == [1] and beside.algorithm == "DFLASH"
        assert beside.engine_options["served_model_name"] == side
        now = Deployment.objects.get(pk=row.pk)
        assert _kept(now) == before and now.run == served_run and not now.draining
        assert tune_task.tune_hold(deployment_id=row.pk) is None
        _until(lambda: not _run(run.pk).is_active, lambda: (
            f"the Tune ends: {_run(run.pk).progress}; the worker's log: "
            f"{(tmp_path / 'worker.log').read_text()[-3000:]}"), timeout_s=400)
        run = _run(run.pk)
        assert run.status == "done", (run.error, run.results.get("reason"))
        assert {c["name"]: c["state"] for c in run.results["candidates"]} == {
            "none": "measured", "dflash": "measured"}
        assert run.results["restore"]["ok"] is True
        assert "stopped and deleted" in run.results["restore"]["message"]
        assert not Deployment.objects.filter(name=side).exists()
        after = Deployment.objects.get(pk=row.pk)
        assert _kept(after) == before and after.run == served_run
