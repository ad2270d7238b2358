"""A deployment whose model the store is still downloading waits, through the real worker.

A real Celery worker and engine agent (processes, on the test database and Redis), the test
engine in Docker, and store entries made by a real scan of the suite's model root. The
download job itself is the store's (web/store); here its entry moves as a job moves it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from tests.conftest_docker import engines_of, remove_engines
from tests.servers import celery_worker, own_host_agent, panel_server
from tests.specs import spec
from tests.waiting import wait_for_status
from tests.worker.conftest import own_agent
from web.builder.builds import deployment_run
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus, EventKind, RootReadRate
from web.deployments.services.installation import instance_id
from web.store.models import ModelEntry, ModelState
from web.store.services.scan import model_store_scan

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
S = DeploymentStatus
FAST = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "6"}
GIB = 1024**3


@pytest.fixture
def stack(test_engine_image: str, tmp_path: Path) -> Iterator[None]:  # noqa: F811
    """A worker and an agent on a GPU-less host running the test engine."""
    extra = ",".join(f"{k}={v}" for k, v in FAST.items())
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": extra, "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
           "APPLIANCE_ENGINE_READY_TIMEOUT_S": "120"}
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=FAST, ENGINE_STOP_TIMEOUT_S=5), \
            panel_server(tmp_path / "web.log", **env) as url, \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env), \
            celery_worker(tmp_path / "worker.log", **env):
        # The worker scans the roots at its start: the tests set entries' states after it.
        _until(lambda: "model_store_scan" in _succeeded(tmp_path / "worker.log"),
               "the worker's first scan of the model roots")
        yield
    remove_engines(instance_id())


def _succeeded(log: Path) -> str:
    """The worker log's lines of tasks that succeeded."""
    text = log.read_text() if log.exists() else ""
    return "\n".join(line for line in text.splitlines() if "succeeded in" in line)


def _downloading(name: str, done: int) -> None:
    ModelEntry.objects.filter(relative_path=name).update(
        state=ModelState.DOWNLOADING, bytes_done=done, size_bytes=4 * GIB, verified_at=None)


def _until(check: Any, what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return found


def _download_events(pk: int) -> list[dict[str, Any]]:
    return [e.payload for e in Deployment.objects.get(pk=pk).events.filter(
        kind=EventKind.PROGRESS, payload__kind="model_download").order_by("seq")]


def test_it_waits_for_the_download_then_starts_the_engine_once_verified(
        stack: None) -> None:
    model_store_scan()
    _downloading("Kimi-K2.6", GIB)
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    _until(lambda: _download_events(pk), "the worker reports the download it waits for")
    deployment = Deployment.objects.get(pk=pk)
    assert (deployment.status, deployment.phase) == (S.QUEUED, "model_download")
    assert deployment.progress["model_download"]["bytes_done"] == GIB
    _downloading("Kimi-K2.6", 3 * GIB)  # the job moves on: the worker, polling, shows it
    _until(lambda: any(e["bytes_done"] == 3 * GIB for e in _download_events(pk)),
           "the progress follows the download")
    assert not engines_of(instance_id(), pk), "no engine while the model downloads"
    assert Deployment.objects.get(pk=pk).status == S.QUEUED
    ModelEntry.objects.filter(relative_path="Kimi-K2.6").update(
        state=ModelState.READY, bytes_done=4 * GIB)
    assert wait_for_status(pk, {S.READY, S.FAILED}, 120) == S.READY
    assert _download_events(pk)[-1]["state"] == "ready"
    assert len(engines_of(instance_id(), pk)) == 1
    # The root had no read rate: the create queued its measurement, the worker made it.
    entry = ModelEntry.objects.get(relative_path="Kimi-K2.6")
    _until(lambda: RootReadRate.objects.filter(root=entry.root).exists(),
           "the worker measured the root's read rate on the models queue")


def test_a_download_that_fails_while_it_waits_fails_the_deployment_and_starts_nothing(
        stack: None) -> None:
    model_store_scan()
    _downloading("Kimi-K2.6-DFlash", GIB)
    pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
    _until(lambda: _download_events(pk), "the worker waits for the drafter")
    ModelEntry.objects.filter(relative_path="Kimi-K2.6-DFlash").update(
        state=ModelState.FAILED, error="sha256 of model.safetensors differs")
    assert wait_for_status(pk, {S.READY, S.FAILED}, 30) == S.FAILED
    deployment = Deployment.objects.get(pk=pk)
    assert deployment.diagnosis["cause"] == "model-download-failed"
    assert "sha256 of model.safetensors differs" in deployment.diagnosis["summary"]
    assert not engines_of(instance_id(), pk)


def test_the_agent_never_starts_an_engine_on_a_model_that_is_no_longer_verified(
        test_engine_image: str, live_server: Any, tmp_path: Path) -> None:  # noqa: F811
    # Verified when the deploy task let it through; partial by the time the agent would
    # start it (a file gone from the folder, found by the next scan).
    model_store_scan()
    with override_settings(ENGINE_IMAGE=test_engine_image, ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=FAST):
        pk = deploying.deployment_create(data=spec(), confirm_warnings=True).pk
        assert deployment_run(deployment_id=pk) == S.STARTING
        ModelEntry.objects.filter(relative_path="Kimi-K2.6").update(
            state=ModelState.PARTIAL, error="model.safetensors is missing")
        # The own host's agent's next look: it would start the engine now.
        with own_agent(live_server.url, tmp_path, gpu_requests=False):
            assert wait_for_status(pk, {S.READY, S.FAILED}, 30) == S.FAILED
    deployment = Deployment.objects.get(pk=pk)
    assert deployment.diagnosis["cause"] == "model-not-ready"
    assert "/models/Kimi-K2.6 (partial)" in deployment.diagnosis["summary"]
    assert not engines_of(instance_id(), pk)
