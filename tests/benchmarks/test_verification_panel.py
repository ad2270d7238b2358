"""The losslessness check in a real browser, as a user runs it from the panel: the form
(the two deployments, the built-in prompts, tokens per answer), then the check's page
filling in while the Celery worker runs it, ending with the summary and the per-prompt
table where the planted divergences stand at their tokens, the divergent token marked.

The form's and the table's ids are what the compose browser test (helper "play") drives:
#id_candidate, #id_baseline, #id_prompt_source, #id_max_tokens, #id_threshold,
#run-verification; #verify-status, #verify-verdict, #match-rate, #near-ties, #failures,
#verify-table rows (data-index, data-verdict; cells td.position, td.gap, two
td.continuation with mark.divergent)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.benchmarks.pair import (
    FIB,
    STACK_ENV,
    baseline_spec,
    speculative_spec,
    wait_until,
)
from tests.e2e.stack import appliance_stack, login
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]


@pytest.fixture
def panel(operator, tmp_path: Path, test_engine_image: str, settings  # type: ignore[no-untyped-def]
          ) -> Iterator[tuple[str, int, int]]:
    settings.ENGINE_GPU_REQUESTS = False
    with appliance_stack(tmp_path, {**STACK_ENV, "APPLIANCE_ENGINE_IMAGE": test_engine_image}
                         ) as url:
        a = deploying.deployment_create(data=speculative_spec(), confirm_warnings=True).pk
        b = deploying.deployment_create(data=baseline_spec(), confirm_warnings=True).pk
        # Before the page: Playwright's loop makes the ORM refuse afterwards.
        wait_until(lambda: Deployment.objects.filter(pk__in=[a, b],
                                                status=DeploymentStatus.READY).count() == 2,
              120, "both ready")
        yield url, a, b


def test_a_check_run_from_the_panel_shows_each_planted_divergence_at_its_token(
        panel, page: Page) -> None:  # type: ignore[no-untyped-def]
    url, a, b = panel
    login(page, url)
    page.goto(f"{url}/benchmarks/")
    page.click("#verifications")
    page.click("#new-verification")
    expect(page.locator("h1")).to_have_text("New losslessness check")
    page.select_option("#id_candidate", str(a))
    page.select_option("#id_baseline", str(b))
    expect(page.locator("#id_prompt_source")).to_have_value("builtin")
    expect(page.locator("#id_threshold")).to_have_value("0.5")
    expect(page.locator("#threshold-why")).to_contain_text("0.125 or less apart")
    page.fill("#id_max_tokens", "24")
    page.click("#run-verification")
    expect(page.locator("h1")).to_have_text(re.compile(r"Losslessness check #\d+"))
    expect(page.locator("#verify-status")).to_have_text("done", timeout=90_000)
    expect(page.locator("#verify-verdict")).to_have_text("failed")
    expect(page.locator("#match-rate")).to_have_text("34/36 (94.4 %)")
    expect(page.locator("#near-ties")).to_have_text("1")
    expect(page.locator("#failures")).to_have_text("1")
    rows = page.locator("#verify-table tbody tr")
    expect(rows).to_have_count(36)
    fib = page.locator('#verify-table tbody tr[data-index="3"]')
    assert FIB.strip() in fib.locator("td.prompt").inner_text()
    expect(fib).to_have_attribute("data-verdict", "failure")
    expect(fib.locator("td.position")).to_have_text("5")
    gap = float(fib.locator("td.gap").inner_text())
    assert gap >= 1.5
    sides = fib.locator("td.continuation")
    expect(sides).to_have_count(2)
    marks = [sides.nth(i).locator("mark.divergent").inner_text() for i in range(2)]
    assert marks[0] != marks[1] and all(m.strip() for m in marks)
    for i in range(2):  # the marked token opens its continuation
        assert sides.nth(i).inner_text().startswith(marks[i])
    fox = page.locator('#verify-table tbody tr[data-index="1"]')
    expect(fox).to_have_attribute("data-verdict", "near-tie")
    expect(fox.locator("td.position")).to_have_text("12")
    expect(fox.locator("td.gap")).to_have_text("0.0625")
    expect(page.locator('#verify-table tbody tr[data-verdict="identical"]')).to_have_count(34)
    assert page.locator("#export-csv").get_attribute("href", timeout=5000)
