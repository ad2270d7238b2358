"""A deployment whose image is built from its recipe: build steps, then the engine phases;
the second deployment of the same recipe is a cache hit. Real Docker, local base image,
and the test engine's package standing in as the SGLang source tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from django.test import override_settings

import docker
from tests.web.specs import spec
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus
from worker import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
S = DeploymentStatus


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True, capture_output=True, text=True,
    )
    return done.stdout.strip()


@pytest.fixture
def site_recipe(tmp_path: Path):  # type: ignore[no-untyped-def]
    repo = tmp_path / "sglang"
    shutil.copytree(ROOT / "docker" / "test-engine" / "sglang", repo / "python" / "sglang")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "test engine as an SGLang source tree")
    commit = _git(repo, "rev-parse", "HEAD")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "site-test-engine.yaml").write_text(
        "name: site-test-engine\n"
        "base_image: appliance-base:bookworm\n"
        f"sglang:\n  git: {repo}\n  ref: {commit}\n  flags: sglang-0.5.23\n"
        "patches: []\n"
        "build_args:\n  SGLANG_INSTALL_DEPS: '0'\n"
    )
    env = {"TEST_ENGINE_PACE_S": "0.01", "TEST_ENGINE_SHARDS": "4"}
    with override_settings(ENGINE_IMAGE="", RECIPES_DIR=str(recipes), ENGINE_GPU_REQUESTS=False,
                           ENGINE_EXTRA_ENV=env, ENGINE_READY_TIMEOUT_S=90,
                           ENGINE_STOP_TIMEOUT_S=5):
        yield "site-test-engine"
    client = docker.from_env()
    tags = set()
    for deployment in Deployment.objects.all():
        tags.add(deployment.image)
        services.deployment_request_stop(deployment=deployment)
        services.deployment_stop(deployment_id=deployment.pk)
    for tag in tags - {""}:
        client.images.remove(tag, force=True)


def _baseline(recipe: str, name: str) -> Deployment:
    data = spec(name=name, recipe=recipe)
    data["engine"] = {"model_path": "/models/Kimi-K2.6", "tp_size": 1,
                      "trust_remote_code": True, "speculative_algorithm": "NONE"}
    return services.deployment_create(data=data, confirm_warnings=True)


def test_a_deployment_builds_its_image_then_starts_and_the_next_one_hits_the_cache(site_recipe):  # type: ignore[no-untyped-def]
    first = _baseline(site_recipe, "built-1")
    assert tasks.deploy.apply(args=[first.pk]).get() == S.READY
    first.refresh_from_db()
    assert first.image.startswith("appliance-engine:site-test-engine-")
    events = list(first.events.order_by("seq"))
    steps = [e.payload for e in events if e.kind == "build" and e.payload["kind"] == "build_step"]
    assert steps and [s["step"] for s in steps] == list(range(1, steps[-1]["total"] + 1))
    phases = [e.payload["status"] for e in events if e.kind == "phase"]
    assert phases == ["building", "starting", "loading", "capturing", "ready"]
    last_build = max(e.seq for e in events if e.kind == "build")
    starting = next(e.seq for e in events if e.kind == "phase" and e.payload["status"] == "starting")
    assert last_build < starting, "the build finishes before the engine starts"

    second = _baseline(site_recipe, "built-2")
    assert tasks.deploy.apply(args=[second.pk]).get() == S.READY
    second.refresh_from_db()
    builds = [e.payload["kind"] for e in second.events.filter(kind="build")]
    assert builds == ["cache_hit"]
    assert second.image == first.image
