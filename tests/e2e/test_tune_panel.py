"""Tune in a real browser, on the simulator (the test engine in Docker), with the Celery
worker, the engine agent and the panel as processes: from the deployment's page, a Tune of
three candidates (no speculation, DFLASH, DDTREE budget 8) at two concurrency levels; the
page follows it live, then shows the candidates, the table, the chart and the
recommendation; Apply redeploys the deployment with the winner; a second Tune cancelled at
its second candidate leaves the deployment as it was (spec, GPUs, name)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.stack import appliance_stack, login
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]
ENV = {"APPLIANCE_ENGINE_GPU_REQUESTS": "0", "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
       "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.01,TEST_ENGINE_SHARDS=2,"
                                     "TEST_ENGINE_TOKEN_S=0.005"}


@pytest.fixture
def tuned(operator, tmp_path: Path, test_engine_image: str, settings) -> Iterator[tuple[str, int]]:  # type: ignore[no-untyped-def]
    settings.ENGINE_GPU_REQUESTS = False
    with appliance_stack(tmp_path, {**ENV, "APPLIANCE_ENGINE_IMAGE": test_engine_image}) as url:
        pk = deploying.deployment_create(data=spec(name="tuned", self_check=False),
                                         confirm_warnings=True).pk
        deadline = time.monotonic() + 120
        while not Deployment.objects.filter(pk=pk, status=DeploymentStatus.READY).exists():
            assert time.monotonic() < deadline, Deployment.objects.get(pk=pk).status
            time.sleep(0.5)
        yield url, pk


def _deployment(page: Page, url: str, pk: int) -> dict[str, Any]:
    response = page.request.get(f"{url}/api/deployments/{pk}/")
    assert response.ok, response.text()
    return dict(response.json())


def _start(page: Page, url: str, pk: int, levels: str, output_len: str) -> None:
    page.goto(f"{url}/deployments/{pk}/")
    page.click("#tune-link")
    expect(page.locator("#id_deployment")).to_have_value(str(pk))
    for name in ("ddtree-16", "ddtree-32"):
        page.uncheck(f"#cand-{name}")
    expect(page.locator("#cand-none")).to_be_disabled()  # the baseline always runs
    page.fill("#id_levels", levels)
    page.fill("#id_num_prompts", "8")
    page.fill("#id_output_len", output_len)
    page.fill("#id_lossless_prompts", "3")
    page.fill("#id_lossless_max_tokens", "12")
    page.fill("#id_time_budget_s", "600")
    page.click("#run-tune")
    expect(page.locator("h1")).to_have_text(re.compile(r"Tune #\d+"))


def test_tune_recommends_applies_and_a_cancelled_one_leaves_the_deployment(  # type: ignore[no-untyped-def]
        tuned, page: Page) -> None:
    url, pk = tuned
    login(page, url)
    before = _deployment(page, url, pk)
    _start(page, url, pk, "1,4", "32")
    # Live: which candidate, which phase, the time left; the deployment out of service.
    expect(page.locator("#tune-progress-text")).to_contain_text(
        re.compile(r"candidate \d of 3: .*time left \d+ s"), timeout=30_000)
    expect(page.locator("#tune-hold")).to_contain_text("out of service for Tune")
    expect(page.locator("#tune-status")).to_have_text("done", timeout=240_000)

    candidates = page.locator("#candidates-table tbody tr")
    expect(candidates).to_have_count(3)
    for i, name in enumerate(("none", "dflash", "ddtree-8")):
        expect(candidates.nth(i).locator("td").nth(0)).to_have_text(name)
        expect(candidates.nth(i).locator("td").nth(2)).to_have_text("measured")
    expect(candidates.nth(1).locator("td").nth(3)).to_contain_text("passed")
    expect(page.locator("#levels-table tbody tr")).to_have_count(6)
    expect(page.locator("#ranges-table tbody tr")).to_have_count(2)
    expect(page.locator("#tune-summary")).to_contain_text("recommended: ")
    expect(page.locator("#tune-simulator")).to_be_visible()
    stats = page.evaluate("ApplianceTune.stats()")
    assert stats["throughput"]["points"] == 2
    assert stats["throughput"]["series"] == ["none", "dflash", "ddtree-8"]
    expect(page.locator("#tune-restore")).to_contain_text("serves its own spec again")
    assert _deployment(page, url, pk)["spec"] == before["spec"]
    assert page.locator("#export-csv").get_attribute("href")

    # Apply: the winner's spec on the deployment.
    winner = page.locator("#apply-candidate").input_value()
    tune = page.request.get(page.url.replace("/benchmarks/tunes/", "/api/tunes/")).json()
    assert winner == tune["recommended"]
    page.click("#apply-tune")
    expect(page.locator("#tune-applied")).to_contain_text(f"Apply {winner}: done",
                                                          timeout=120_000)
    applied = _deployment(page, url, pk)
    assert applied["status"] == "ready" and applied["gpus"] == before["gpus"]
    engine = next(c for c in tune["config"]["candidates"] if c["name"] == winner)["engine"]
    for key, value in engine.items():
        assert applied["spec"]["engine"].get(key) == value, (key, applied["spec"]["engine"])

    # A second Tune, cancelled while its second candidate is measured (long answers: a level
    # lasts seconds): the deployment as Apply left it.
    _start(page, url, pk, "4", "1500")
    expect(page.locator("#tune-progress-text")).to_contain_text(
        re.compile(r"candidate 2 of 3: dflash, benchmark"), timeout=120_000)
    page.click("#cancel-tune")
    expect(page.locator("#tune-status")).to_have_text("cancelled", timeout=120_000)
    expect(page.locator("#tune-error")).to_contain_text("cancelled by the operator during")
    # (when Apply's winner was dflash, the candidate cancelled is the deployment's own spec)
    expect(page.locator("#tune-restore")).to_contain_text(re.compile(
        r"serves its own spec again|still serves its own spec; nothing to restore"))
    after = _deployment(page, url, pk)
    assert after["status"] == "ready"
    assert (after["spec"], after["gpus"], after["name"]) == (
        applied["spec"], applied["gpus"], applied["name"])
    with contextlib.suppress(Exception):
        page.goto(f"{url}/deployments/{pk}/")
    expect(page.locator("#tune-hold")).to_have_count(0)
