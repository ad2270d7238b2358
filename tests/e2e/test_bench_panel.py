"""An A/B benchmark in a real browser: two test-engine deployments whose speeds differ
(acceptance length 6 against 2 tokens per decode step at the same step time), run from the
panel's form by the Celery worker; the page shows the speedup table and both charts."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.stack import login
from tests.e2e.test_metrics_panel import _stack
from tests.specs import spec
from web.deployments import services
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]


def _wait_ready(*pks: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Deployment.objects.filter(pk__in=pks, status=DeploymentStatus.READY).count() == len(pks):
            return
        time.sleep(1)
    raise AssertionError(f"not ready: {list(Deployment.objects.values_list('name', 'status'))}")


def _deploy(name: str, gpu: int, **env: str) -> int:
    """Each on its own GPU: two deployments never hold the same one (GPU leases)."""
    data = spec(name=name, env=env, self_check=False, gpus=[gpu])
    return services.deployment_create(data=data, confirm_warnings=True).pk


@pytest.fixture
def fast_and_slow(operator, tmp_path: Path, test_engine_image: str, settings):  # type: ignore[no-untyped-def]
    settings.ENGINE_GPU_REQUESTS = False
    with _stack(tmp_path, test_engine_image) as url:
        fast = _deploy("fast", 0, TEST_ENGINE_ACCEPT_LEN="6")
        slow = _deploy("slow", 1, TEST_ENGINE_ACCEPT_LEN="2")
        _wait_ready(fast, slow)  # before the page: Playwright's loop makes the ORM refuse
        yield url, fast, slow


def test_an_ab_benchmark_shows_the_speedup_and_charts(fast_and_slow, page: Page) -> None:  # type: ignore[no-untyped-def]
    url, fast, slow = fast_and_slow
    login(page, url)
    page.goto(f"{url}/benchmarks/new/")
    page.check(f'input[name="deployments"][value="{fast}"]')
    page.check(f'input[name="deployments"][value="{slow}"]')
    page.select_option("#id_baseline", str(slow))
    page.fill("#id_levels", "1,4")
    page.fill("#id_num_prompts", "8")
    page.fill("#id_input_len", "16")
    page.fill("#id_output_len", "64")
    page.click("#run-benchmark")
    expect(page.locator("h1")).to_have_text(re.compile(r"Benchmark #\d+"))
    rows = page.locator("#speedup-table tbody tr")
    expect(rows).to_have_count(2, timeout=90_000)
    expect(page.locator("#bench-status")).to_have_text("done")
    for i in range(2):
        ratio = float(rows.nth(i).locator("td").nth(2).inner_text().rstrip("x"))
        # E[accepted] is about 6.0 against 2.1 (rounded, clipped Gaussian): about 2.9x.
        assert 2.2 < ratio < 3.6, ratio
        expect(rows.nth(i).locator("td").nth(4)).to_contain_text("faster than slow#")
    stats = page.evaluate("ApplianceBench.stats()")
    for chart in ("chart-throughput", "chart-tpot"):
        assert stats[chart]["points"] == 2 and len(stats[chart]["series"]) == 2
    assert page.locator("#export-csv").get_attribute("href", timeout=5000)
