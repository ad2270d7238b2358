"""A deployment whose image is built from its recipe: build steps, the real GPU self-check,
then the engine phases; the next deployment of the same recipe is a cache hit; a stop through
the API cancels a running build. Real Docker, a local base image, and the test engine's
package standing in as the SGLang source tree (CI has no network to fetch SGLang)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.conf import settings
from django.test import override_settings

import docker
from tests.conftest_docker import engines_of, remove_engines
from tests.servers import celery_worker, own_host_agent, panel_server
from tests.site_recipes import SLOW_EXTRAS, engine_source_repo, write_recipe
from tests.specs import spec
from tests.waiting import wait_for_status
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus
from web.deployments.services.installation import instance_id
from worker import tasks

# test_panel.py removes every image of the site-test-engine recipe: one worker for both.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker,
              pytest.mark.xdist_group("site-test-engine")]
S = DeploymentStatus


def _remove_images(tags: set[str]) -> None:
    client = docker.from_env()
    for tag in tags - {""}:
        # noprune: the untagged layers under it are other builds' cache, maybe in use now
        client.images.remove(tag, force=True, noprune=True)


@pytest.fixture
def site_recipe(tmp_path: Path):  # type: ignore[no-untyped-def]
    recipes = tmp_path / "recipes"
    write_recipe(recipes, "site-test-engine", engine_source_repo(tmp_path))
    env = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "4"}
    with override_settings(ENGINE_IMAGE="", RECIPES_DIR=str(recipes), ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=env, ENGINE_READY_TIMEOUT_S=90,
                           ENGINE_STOP_TIMEOUT_S=5):
        yield "site-test-engine"
    tags = set()
    for deployment in Deployment.objects.all():
        tags.add(deployment.image)
    remove_engines(instance_id())  # the agent is gone by now: its engines go by hand
    _remove_images(tags)


def _run(pk: int) -> str:
    """The deploy task (the build), then the agent beside the test until the engine settles."""
    tasks.deploy.apply(args=[pk]).get()
    return wait_for_status(pk, {S.READY, S.FAILED, S.STOPPED}, 90)


def _baseline(recipe: str, name: str, self_check: bool = True,
              rebuild_image: bool = False, gpu: int = 0) -> Deployment:
    data = spec(name=name, recipe=recipe, self_check=self_check, gpus=[gpu])
    data["engine"] = {"model_path": "/models/Kimi-K2.6", "tp_size": 1,
                      "trust_remote_code": True, "speculative_algorithm": "NONE"}
    return deploying.deployment_create(data=data, confirm_warnings=True,
                                       rebuild_image=rebuild_image)


def test_a_built_image_runs_the_real_self_check_first_and_the_next_deployment_hits_the_cache(site_recipe, agent):  # type: ignore[no-untyped-def]
    first = _baseline(site_recipe, "built-1")
    # The image holds the real appliance.selfcheck; this machine has no GPU, no NVML and
    # no torch, so the real check fails and the deployment stops before any model load.
    with override_settings(BUILD_CA_BUNDLE="/etc/ssl/certs/ca-certificates.crt"):
        assert _run(first.pk) == S.FAILED
    first.refresh_from_db()
    assert first.image.startswith("appliance-engine:site-test-engine-"), first.last_lines
    events = list(first.events.order_by("seq"))
    steps = [e.payload for e in events if e.kind == "build" and e.payload["kind"] == "build_step"]
    assert steps and [s["step"] for s in steps] == list(range(1, steps[-1]["total"] + 1))
    phases = [e.payload["status"] for e in events if e.kind == "phase"]
    assert phases == ["building", "starting", "checking", "failed"]
    assert any("CA bundle in use" in e.payload["text"] for e in events if e.kind == "build")
    last_build = max(e.seq for e in events if e.kind == "build")
    starting = next(e.seq for e in events if e.kind == "phase" and e.payload["status"] == "starting")
    assert last_build < starting, "the build finishes before the engine starts"
    checks = {e.payload["id"]: e.payload for e in events
              if e.kind == "selfcheck" and e.payload["kind"] == "selfcheck_check"}
    assert set(checks) == {"nvml-available", "torch-available"}
    assert first.diagnosis["cause"] == "gpu-selfcheck-failed"
    assert "pynvml is not importable" in first.diagnosis["summary"]
    assert first.diagnosis["fix"] == "install nvidia-ml-py in the engine image"
    assert not any(e.kind == "progress" for e in events), "the model never started loading"

    second = _baseline(site_recipe, "built-2", self_check=False)
    assert _run(second.pk) == S.READY
    second.refresh_from_db()
    builds = [e.payload["kind"] for e in second.events.filter(kind="build")]
    assert builds == ["cache_hit"]
    assert second.image == first.image
    phases = [e.payload["status"] for e in second.events.filter(kind="phase").order_by("seq")]
    assert phases == ["building", "starting", "loading", "capturing", "ready"]

    # Asked to rebuild, the same recipe builds again, layer cache off, to the same tag.
    # GPU 0 is leased to built-2, which is still ready.
    third = _baseline(site_recipe, "built-3", self_check=False, rebuild_image=True, gpu=1)
    assert _run(third.pk) == S.READY
    third.refresh_from_db()
    builds = [e.payload for e in third.events.filter(kind="build").order_by("seq")]
    assert third.image == first.image and builds[-1]["kind"] == "built"
    assert "cache_hit" not in [b["kind"] for b in builds]
    assert len([b for b in builds if b["kind"] == "build_step"]) == len(steps)
    assert not any("Using cache" in b["text"] for b in builds)


STALE_PATCH = "\n".join([
    "--- a/python/sglang/__init__.py",
    "+++ b/python/sglang/__init__.py",
    "@@ -1,3 +1,3 @@",
    '-"""The real SGLang, which this test source is not.',
    '+"""Patched.',
    " ",  # the blank context line of a unified diff is one space
    " It is NOT SGLang. It installs itself as the `sglang` package inside the test engine",
    "",
])


def test_a_patch_that_does_not_apply_fails_the_deployment_naming_patch_file_and_hunk(
        site_recipe, tmp_path):  # type: ignore[no-untyped-def]
    recipes = Path(settings.RECIPES_DIR)
    (recipes / "stale.patch").write_text(STALE_PATCH)
    write_recipe(recipes, "site-stale-patch", tmp_path / "sglang", patches=["stale.patch"])
    deployment = _baseline("site-stale-patch", "stale")
    assert _run(deployment.pk) == S.FAILED
    deployment.refresh_from_db()
    diagnosis = deployment.diagnosis
    assert diagnosis["cause"] == "image-build-failed"
    assert "patch stale.patch does not apply: file python/sglang/__init__.py, hunk #1" in \
        diagnosis["summary"]
    evidence = diagnosis["evidence"]
    assert (evidence["patch"], evidence["file"], evidence["hunk"]) == (
        "stale.patch", "python/sglang/__init__.py", 1)
    assert "apply_patches.py" in evidence["step_text"]
    assert deployment.last_lines and any("FAILED" in line for line in deployment.last_lines)
    phases = [e.payload["status"] for e in deployment.events.filter(kind="phase").order_by("seq")]
    assert phases == ["building", "failed"]
    assert not deployment.image and not engines_of(instance_id(), deployment.pk)


def _wait(what: str, check: Any, limit_s: float = 120) -> Any:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_stop_through_the_api_cancels_a_silent_build_step(operator, token_for, tmp_path):  # type: ignore[no-untyped-def]
    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # no stale tasks from other tests
    recipes = tmp_path / "recipes"
    write_recipe(recipes, "site-slow-build", engine_source_repo(tmp_path, slow_extra=True),
                 extras=SLOW_EXTRAS)
    env = {"APPLIANCE_ENGINE_IMAGE": "", "APPLIANCE_RECIPES_DIR": str(recipes),
           "APPLIANCE_ENGINE_GPU_REQUESTS": "0"}
    api = requests.Session()
    api.headers["Authorization"] = f"Token {token_for(operator)}"
    data = spec(name="slow-build", recipe="site-slow-build")
    data["engine"] = {"model_path": "/models/Kimi-K2.6", "tp_size": 1,
                      "trust_remote_code": True, "speculative_algorithm": "NONE"}
    client = docker.from_env()
    with panel_server(tmp_path / "web.log", **env) as url, \
            celery_worker(tmp_path / "worker.log", **env), \
            own_host_agent(tmp_path / "agent.log", url, tmp_path, **env):
        created = api.post(f"{url}/api/deployments/", json={"spec": data, "confirm_warnings": True})
        assert created.status_code == 201, created.text
        pk = created.json()["id"]

        def silent_step() -> bool:
            events = api.get(f"{url}/api/deployments/{pk}/events/").json()["results"]
            return any(e["kind"] == "build" and "install-sglang" in e["payload"]["text"]
                       for e in events)

        _wait("the pip-extras build step", silent_step)

        def step_containers() -> list[Any]:
            return [c for c in client.api.containers(all=True)  # one call: no per-container race
                    if "install-sglang" in c.get("Command", "")]

        _wait("the silent step's RUN container", step_containers)
        time.sleep(2)  # the step is now inside the silent setup.py
        stopped_at = time.monotonic()
        answer = api.post(f"{url}/api/deployments/{pk}/stop/")
        assert answer.status_code in (200, 202), answer.text
        _wait("the build's RUN container to go", lambda: not step_containers(), 60)
        took = time.monotonic() - stopped_at
        status = _wait("stopped", lambda: api.get(f"{url}/api/deployments/{pk}/").json()["status"]
                       in ("stopped", "failed") and api.get(f"{url}/api/deployments/{pk}/").json())
        assert status["status"] == "stopped"
        # The build worker ends its task with the stop done (its build's run never started
        # an engine: no agent has anything of it), or `stopping` where a Stop came between.
        ended = re.compile(r"worker\.tasks\.deploy\[[^]]*\] succeeded in [^:]*: '(stopping|stopped)'")
        _wait("the deploy task to end",
              lambda: ended.search((tmp_path / "worker.log").read_text()), 30)
    deployment = Deployment.objects.get(pk=pk)
    assert not deployment.image and not client.images.list(
        filters={"label": "appliance.recipe=site-slow-build"})
    print(f"stop -> build step container gone: {took:.1f} s")
    assert took < 30, f"the build was not cancelled promptly ({took:.1f} s)"
