"""An A/B benchmark in a real browser: a DFLASH test-engine deployment against one without
speculation, each playing the real engine's recording of its mode (the test engine's
profile.py: the trained pair's DFLASH and no-speculation runs where the image has them),
run from the panel's form by the Celery worker; the page shows the speedup table, within
10 % of the recordings' own A/B (tests/testengine/test_recorded_speculation.py holds it to
5 % without a browser), and both charts."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.stack import appliance_stack, login
from tests.real_engine import ROOT as RECORDINGS
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment, DeploymentStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]


def _wait_ready(*pks: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Deployment.objects.filter(pk__in=pks, status=DeploymentStatus.READY).count() == len(pks):
            return
        time.sleep(1)
    raise AssertionError(f"not ready: {list(Deployment.objects.values_list('name', 'status'))}")


def _deploy(name: str, gpu: int, algorithm: str) -> int:
    """Each on its own GPU: two deployments never hold the same one (GPU leases)."""
    data = spec(name=name, self_check=False, gpus=[gpu])
    if algorithm == "NONE":
        data["recipe"] = "kimi-k2.6-baseline"
        data["engine"] = {"model_path": "/models/Kimi-K2.6", "tp_size": 1,
                          "trust_remote_code": True}
    else:
        data["recipe"] = "kimi-k2.6-dflash"
        data["engine"]["speculative_algorithm"] = algorithm
        data["engine"].pop("speculative_ddtree_budget", None)
    return deploying.deployment_create(data=data, confirm_warnings=True).pk


def _recorded_ratio(level: int) -> float:
    """The A/B the recordings the two engines play show at this level (profile.py's set)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docker" / "test-engine"))
    from sglang.test_engine import profile

    chosen = profile.SETS[profile.chosen_set()]
    figures = []
    for run in (chosen["DFLASH"][8], chosen["NONE"][0]):
        levels = [lv for e in json.loads((RECORDINGS / run / "bench.json").read_text())
                  for lv in e["json"]["levels"]]
        figures.append(next(lv["output_throughput"] for lv in levels
                            if lv["concurrency"] == level))
    return figures[0] / figures[1]


def _stack(tmp_path: Path, image: str):  # type: ignore[no-untyped-def]
    """The stack with engines that keep their recordings' step costs (no TEST_ENGINE_TOKEN_S:
    that would pace both alike, and the ratio would be the accept length alone)."""
    return appliance_stack(tmp_path, {
        "APPLIANCE_ENGINE_IMAGE": image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
        "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.03,TEST_ENGINE_SHARDS=8,"
                                      "TEST_ENGINE_DECODE_LOG_INTERVAL=40",
        "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5", "APPLIANCE_METRICS_INTERVAL_S": "1"})


@pytest.fixture
def fast_and_slow(operator, tmp_path: Path, test_engine_image: str, settings):  # type: ignore[no-untyped-def]
    settings.ENGINE_GPU_REQUESTS = False
    with _stack(tmp_path, test_engine_image) as url:
        fast = _deploy("fast", 0, "DFLASH")
        slow = _deploy("slow", 1, "NONE")
        _wait_ready(fast, slow)  # before the page: Playwright's loop makes the ORM refuse
        yield url, fast, slow


@pytest.mark.exclusive  # the engines' recorded step costs: other workers' CPU use skews them
def test_an_ab_benchmark_shows_the_speedup_and_charts(fast_and_slow, page: Page) -> None:  # type: ignore[no-untyped-def]
    url, fast, slow = fast_and_slow
    login(page, url)
    page.goto(f"{url}/benchmarks/new/")
    page.check(f'input[name="deployments"][value="{fast}"]')
    page.check(f'input[name="deployments"][value="{slow}"]')
    page.select_option("#id_baseline", str(slow))
    page.fill("#id_levels", "1,4")
    page.fill("#id_num_prompts", "8")  # as the recordings' benches at 1 and 4
    page.fill("#id_input_len", "16")
    page.fill("#id_output_len", "128")
    page.click("#run-benchmark")
    expect(page.locator("h1")).to_have_text(re.compile(r"Benchmark #\d+"))
    rows = page.locator("#speedup-table tbody tr")
    expect(rows).to_have_count(2, timeout=90_000)
    expect(page.locator("#bench-status")).to_have_text("done")
    for i, level in enumerate((1, 4)):
        ratio = float(rows.nth(i).locator("td").nth(2).inner_text().rstrip("x"))
        want = _recorded_ratio(level)
        assert ratio == pytest.approx(want, rel=0.10), (level, ratio, want)
        expect(rows.nth(i).locator("td").nth(4)).to_contain_text(re.compile(
            "faster than slow#" if ratio > 1 else "slower than slow#" if ratio < 1
            else r"as fast as slow#\d+ \(simulator\) \(1\.00x\)"))
    stats = page.evaluate("ApplianceBench.stats()")
    for chart in ("chart-throughput", "chart-tpot"):
        assert stats[chart]["points"] == 2 and len(stats[chart]["series"]) == 2
    assert page.locator("#export-csv").get_attribute("href", timeout=5000)
