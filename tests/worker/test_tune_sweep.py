"""A Tune whose worker is killed mid-candidate, on the production road: the Celery worker,
the engine agent and the panel loop (processes, on the test database and Redis) and the test
engine in Docker. The killed worker's message stays unacked in the broker; the panel loop's
sweep sees the Tune's beat stop, sends the task again, and a new worker's copy restores the
deployment and ends the Tune, saying why."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from tests.conftest_docker import remove_engines
from tests.servers import celery_worker, own_host_agent, panel_loop, panel_server
from tests.specs import spec
from tests.waiting import wait_for_status
from web.benchmarks import tune_services, tune_task
from web.benchmarks.tune_models import TuneRun
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
FAST = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "2", "TEST_ENGINE_TOKEN_S": "0.004"}
CONFIG = {"levels": [4], "num_prompts": 8, "output_len": 2000, "prompt_source": "builtin",
          "warmup": 1, "time_budget_s": 900, "deploy_timeout_s": 120, "lossless_prompts": 3,
          "lossless_max_tokens": 12}


@pytest.fixture
def env(test_engine_image: str) -> Iterator[dict[str, str]]:  # noqa: F811
    extra = ",".join(f"{k}={v}" for k, v in FAST.items())
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=FAST, ENGINE_STOP_TIMEOUT_S=5):
        yield {"APPLIANCE_ENGINE_IMAGE": test_engine_image,
               "APPLIANCE_ENGINE_GPU_REQUESTS": "0", "APPLIANCE_ENGINE_EXTRA_ENV": extra,
               "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5", "APPLIANCE_ENGINE_READY_TIMEOUT_S": "90",
               "APPLIANCE_ENGINE_TEST_ENV": "1", "APPLIANCE_AGENT_TICK_MS": "250",
               "APPLIANCE_LOOP_TICK_MS": "250",
               # the sweep's bound on a Tune's silence, short for the test
               "APPLIANCE_TUNE_LOST_S": "4"}
    remove_engines(instance_id())


def _until(check: Any, what: Any, timeout_s: float = 240) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.2)
    return found


def _run(pk: int) -> TuneRun:
    return TuneRun.objects.get(pk=pk)


def _kept(row: Deployment) -> dict[str, Any]:
    return {"spec": row.spec, "gpus": row.gpus, "algorithm": row.algorithm, "name": row.name,
            "status": row.status, "served": row.engine_options.get("served_model_name")}


def test_a_tune_whose_worker_is_killed_is_restored_through_the_loops_sweep(
        env: dict[str, str], tmp_path: Path) -> None:
    """The worker running a Tune is killed mid-candidate (its message stays unacked in the
    broker): the panel loop's sweep sees no beat, sends the task again, and a new worker's
    copy restores the deployment and ends the Tune, saying why."""
    with panel_server(tmp_path / "web.log", **env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env), \
            panel_loop(tmp_path / "loop.log", **env):
        with celery_worker(tmp_path / "worker.log", **env) as worker:
            row = deploying.deployment_create(data=spec(gpus=[0]), confirm_warnings=True)
            assert wait_for_status(row.pk, {S.READY, S.FAILED}, 120) == S.READY
            row.refresh_from_db()
            before = _kept(row)
            run = tune_services.tune_create(deployment_id=row.pk, candidates=["dflash"],
                                            config=dict(CONFIG))
            _until(lambda: ((p := _run(run.pk).progress or {}).get("index"), p.get(
                "phase")) == (2, "benchmark"), lambda: f"measured: {_run(run.pk).progress}")
            worker.kill()
            worker.wait(timeout=30)
        assert _run(run.pk).status == "running"  # stranded, until the sweep
        with celery_worker(tmp_path / "worker2.log", **env):
            _until(lambda: not _run(run.pk).is_active, lambda: (
                f"the sweep ends it: {_run(run.pk).progress}; the loop's log: "
                f"{(tmp_path / 'loop.log').read_text()[-2000:]}"), timeout_s=240)
    run = _run(run.pk)
    assert run.status == "failed" and run.error.startswith(
        "the worker running this Tune stopped mid-run; the Tune ended"), run.error
    assert run.results["restore"]["ok"] is True
    assert "serves its own spec again" in run.results["restore"]["message"]
    assert f"Tune #{run.pk}: its worker stopped (no beat)" in (
        tmp_path / "loop.log").read_text()
    after = Deployment.objects.get(pk=row.pk)
    assert _kept(after) == before and not after.draining
    assert tune_task.tune_hold(deployment_id=row.pk) is None
