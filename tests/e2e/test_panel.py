"""The whole spine in a real browser: Chromium (Playwright) -> uvicorn panel -> PostgreSQL
-> Celery worker over Redis -> Docker -> the test engine, and back live over SSE."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

import docker
from tests.e2e.screenshots import screenshot_path
from tests.e2e.stack import appliance_stack, login
from tests.site_recipes import engine_source_repo, write_recipe

# test_build_deploy.py builds images of the same recipe, which this module removes.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e,
              pytest.mark.xdist_group("site-test-engine")]


@pytest.fixture
def stack(tmp_path: Path, test_engine_image: str):  # type: ignore[no-untyped-def]  # noqa: F811
    env = {
        "APPLIANCE_ENGINE_IMAGE": test_engine_image,
        "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
        "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.06,TEST_ENGINE_SHARDS=12",
        "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
    }
    with appliance_stack(tmp_path, env) as url:
        yield url


@pytest.fixture
def building_stack(tmp_path: Path):  # type: ignore[no-untyped-def]
    """No configured image: deployments build theirs from a site recipe whose SGLang source
    is the test engine's package (CI cannot fetch SGLang)."""
    recipes = tmp_path / "recipes"
    write_recipe(recipes, "site-test-engine", engine_source_repo(tmp_path))
    env = {"APPLIANCE_ENGINE_IMAGE": "", "APPLIANCE_RECIPES_DIR": str(recipes),
           "APPLIANCE_ENGINE_GPU_REQUESTS": "0", "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5"}
    with appliance_stack(tmp_path, env) as url:
        yield url
    client = docker.from_env()
    for image in client.images.list(filters={"label": "appliance.recipe=site-test-engine"}):
        # noprune: the untagged layers under it are other builds' cache, maybe in use now
        client.images.remove(image.id, force=True, noprune=True)


def test_an_operator_deploys_watches_it_come_up_live_and_stops_it(operator, stack, page):  # type: ignore[no-untyped-def]
    login(page, stack)
    page.click("text=New deployment")
    # The form starts from the first recipe's own defaults (the baseline: no speculation) and
    # choosing another recipe fills its algorithm and engine defaults.
    expect(page.locator("#id_recipe")).to_have_value("kimi-k2.6-baseline")
    expect(page.locator("#id_algorithm")).to_have_value("NONE")
    expect(page.locator("#id_tree_budget")).to_have_value("")
    page.fill("#id_name", "kimi-ddtree")
    page.select_option("#id_recipe", "kimi-k2.6-ddtree")
    expect(page.locator("#id_algorithm")).to_have_value("DDTREE")
    expect(page.locator("#id_block_size")).to_have_value("8")
    expect(page.locator("#id_tree_budget")).to_have_value("32")
    expect(page.locator("#id_attention_backend")).to_have_value("fa3")
    page.fill("#id_model_path", "/models/Kimi-K2.6")
    page.fill("#id_drafter_path", "/models/Kimi-K2.6-DFlash")
    page.fill("#id_gpu_ids", "0,1,x")
    page.click("#deploy")
    # Bad input comes back inline, beside its field, and nothing was queued.
    expect(page.locator("#field-gpu_ids .field-error")).to_contain_text("comma-separated")
    page.fill("#id_gpu_ids", "0,1,2,3,4,5,6,7")
    page.check("#id_confirm_warnings")
    page.click("#deploy")

    expect(page.locator("h1")).to_have_text("kimi-ddtree")
    deployment_id = page.locator("#deployment-id").inner_text().lstrip("#")
    # Pre-flight ran before queueing: the patched recipe verifies 33 wide, drafts 8 wide.
    expect(page.locator("#preflight")).to_contain_text("ddtree-verify-width")
    expect(page.locator("#preflight")).to_contain_text("33")
    # The page asks again for a stream not open after 15 s (detail.js STREAM_OPEN_MS): on a
    # loaded machine the first ask can miss it, the second must not.
    expect(page.locator("#conn")).to_have_text("live", timeout=45_000)
    # Build (here the configured image), then the GPU self-check, then the engine phases.
    expect(page.locator("#build-text")).to_contain_text("using the configured image")
    expect(page.locator("#selfcheck")).to_be_visible(timeout=30_000)
    expect(page.locator("#selfcheck-text")).to_contain_text("passed in", timeout=30_000)
    expect(page.locator("#selfcheck-gpus")).to_contain_text("8 × NVIDIA H200 (test engine)")
    expect(page.locator("#selfcheck-checks .check-ok")).to_have_count(5)
    expect(page.locator("#selfcheck-checks")).to_contain_text("target_verify graph at width 33")
    expect(page.locator("#log")).to_contain_text("Load weight begin", timeout=30_000)
    expect(page.locator("#weights-text")).to_contain_text("shard", timeout=30_000)
    expect(page.locator("#capture-text")).to_contain_text("batch", timeout=30_000)
    expect(page.locator("#log .stderr").first).to_be_visible()
    expect(page.locator("#status")).to_have_text("ready", timeout=60_000)
    expect(page.locator("#log")).to_contain_text("fired up and ready to roll")
    # "Deployment ... queued." was true when it was made; beside "ready" it would not be.
    expect(page.locator(".flash")).to_have_count(0)
    # The self-check's JSON stream lines are the card's data: the log has a short line each.
    expect(page.locator("#log")).to_contain_text("self-check: allreduce ok")
    expect(page.locator("#log")).not_to_contain_text("gpu-check: {")
    for phase in ("building", "starting", "checking", "loading", "capturing"):
        expect(page.locator(f"#timeline li[data-phase={phase}]")).to_have_class("done")
    page.screenshot(path=screenshot_path("detail-ready.png"), full_page=True)

    page.click("#stop")  # a confirm page first: reloading the model takes minutes
    expect(page.locator("#confirm-stop")).to_contain_text("kimi-ddtree")
    expect(page.locator("#confirm-stop")).to_contain_text("takes minutes")
    page.click("#confirm")
    expect(page.locator("#status")).to_have_text("stopped", timeout=30_000)
    expect(page.locator(".flash")).to_have_count(0)  # "Stopping ..." went with stopping
    expect(page.locator("#restart")).to_be_visible()  # the badge's status shows the actions
    expect(page.locator("#stop")).to_be_hidden()
    page.goto(f"{stack}/")
    # The list names each deployment by id too, and when it was made, in UTC.
    row = page.locator(f"#deployment-{deployment_id}")
    expect(row).to_contain_text(f"#{deployment_id}")
    expect(row).to_contain_text("kimi-ddtree")
    expect(row).to_contain_text("stopped")
    expect(row.locator("time")).to_contain_text(" UTC")


def test_a_built_image_runs_the_real_self_check_and_the_panel_shows_why_it_stopped(  # type: ignore[no-untyped-def]
        operator, building_stack, page):
    login(page, building_stack)
    page.click("text=New deployment")
    page.fill("#id_name", "built-here")
    page.select_option("#id_recipe", "site-test-engine")
    page.fill("#id_model_path", "/models/Kimi-K2.6")
    page.select_option("#id_algorithm", "NONE")
    page.fill("#id_tp_size", "1")
    page.fill("#id_gpu_ids", "0")
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    expect(page.locator("h1")).to_have_text("built-here")
    # The build streams step i / N, then the image's real gpucheck runs before any load.
    expect(page.locator("#build-text")).to_contain_text("step ", timeout=30_000)
    # The image's build comes first (28 steps: 90 s was not enough on a loaded machine).
    expect(page.locator("#selfcheck-checks")).to_contain_text("pynvml is not importable",
                                                              timeout=300_000)
    expect(page.locator("#status")).to_have_text("failed", timeout=30_000)
    expect(page.locator("#build-text")).to_contain_text("built appliance-engine:site-test-engine-")
    expect(page.locator("#selfcheck-text")).to_contain_text("FAILED")
    expect(page.locator("#selfcheck-checks .check-fail")).to_have_count(2)
    expect(page.locator("#diag-cause")).to_have_text("gpu-selfcheck-failed")
    expect(page.locator("#diag-fix")).to_have_text("install nvidia-ml-py in the engine image")
    for phase in ("queued", "building", "starting"):
        expect(page.locator(f"#timeline li[data-phase={phase}]")).to_have_class("done")
    expect(page.locator("#timeline li[data-phase=checking]")).to_have_class("failed")
    expect(page.locator("#timeline li[data-phase=loading]")).to_have_class("")
    expect(page.locator("#log")).not_to_contain_text("Load weight begin")
    # The build's own output is in the log too, before the container's first line.
    expect(page.locator("#log .build").first).to_contain_text("build step 1/")
    expect(page.locator("#log")).to_contain_text("appliance: no patches to apply")
    expect(page.locator("#log")).to_contain_text("self-check: nvml-available FAILED")
    expect(page.locator("#log")).not_to_contain_text("gpu-check: {")
    page.screenshot(path=screenshot_path("detail-selfcheck-failed.png"), full_page=True)
