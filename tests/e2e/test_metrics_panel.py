"""Live metrics and alerts in a real browser: Chromium -> uvicorn panel -> PostgreSQL, the
engine agent scraping the test engine's /metrics -> Redis -> SSE -> uPlot charts.

The test engine's modes stand in for the faults (docker/test-engine/README.md): traffic of
its own, an acceptance collapse after ready, silent eager decoding, a quiet capture."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.charts import FULL_WINDOW_REDRAW
from tests.e2e.screenshots import screenshot_path
from tests.e2e.stack import appliance_stack, login
from tests.specs import spec
from web.deploy import services as deploying

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]

# Two clients of the engine's own (the pace, a step per 20 ms and a decode line per 40
# steps, is the stack's: a spec's env refuses names that look like secrets, as *_TOKEN_S).
TRAFFIC = {"TEST_ENGINE_TRAFFIC": "2"}


@contextlib.contextmanager
def _stack(tmp_path: Path, image: str) -> Iterator[str]:
    env = {
        "APPLIANCE_ENGINE_IMAGE": image,
        "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
        "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.03,TEST_ENGINE_SHARDS=8,"
                                      "TEST_ENGINE_TOKEN_S=0.02,"
                                      "TEST_ENGINE_DECODE_LOG_INTERVAL=40",
        "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
        "APPLIANCE_METRICS_INTERVAL_S": "1",  # one point per second per series
        "APPLIANCE_ALERT_STALL_S": "4",
    }
    with appliance_stack(tmp_path, env) as url:
        yield url


@pytest.fixture
def stack(tmp_path: Path, test_engine_image: str) -> Iterator[str]:
    with _stack(tmp_path, test_engine_image) as url:
        yield url


def _deploy(name: str, gpu: int = 0, **env: str) -> int:
    # Each on its own GPU: a GPU another live deployment holds is refused (GPU leases).
    data = spec(name=name, env=env, self_check=False, gpus=[gpu])
    return deploying.deployment_create(data=data, confirm_warnings=True).pk


# Deployments are made before the page: Playwright's loop makes the ORM refuse afterwards.
@pytest.fixture
def healthy_and_collapsing(operator, stack: str, settings) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    settings.ENGINE_GPU_REQUESTS = False  # as the stack's processes run
    return (_deploy("healthy", **TRAFFIC),
            _deploy("collapsing", 1, TEST_ENGINE_FAIL="accept-collapse",
                    TEST_ENGINE_COLLAPSE_AFTER_S="25", **TRAFFIC))


@pytest.fixture
def eager_and_stalled(operator, stack: str, settings) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    settings.ENGINE_GPU_REQUESTS = False
    return (_deploy("eager", TEST_ENGINE_FAIL="ddtree-eager", **TRAFFIC),
            _deploy("stalled", 1, TEST_ENGINE_FAIL="capture-stall"))


def _stats(page: Page) -> dict[str, Any]:
    return page.evaluate("ApplianceCharts.stats()")  # type: ignore[no-any-return]


def _alert(page: Page, alert_id: str) -> Any:
    return page.locator(f'#alerts li[data-alert="{alert_id}"]')


def test_a_ready_deployment_charts_live_and_an_acceptance_collapse_alerts(  # type: ignore[no-untyped-def]
        stack, healthy_and_collapsing, page):
    healthy, collapsing = healthy_and_collapsing
    login(page, stack)
    page.goto(f"{stack}/deployments/{healthy}/")
    expect(page.locator("#status")).to_have_text("ready", timeout=90_000)
    expect(page.locator("#charts")).to_be_visible(timeout=20_000)
    # The Decode card is filled from the engine's /metrics, with units.
    expect(page.locator("#stat-gen_throughput")).to_contain_text("tok/s", timeout=20_000)
    expect(page.locator("#stat-cuda_graph")).to_have_text("yes")
    expect(page.locator("#stat-accept_len")).to_have_text(re.compile(r"^\d\.\d\d$"),
                                                           timeout=10_000)
    # Each chart's title holds its latest value and unit, and the charts move.
    expect(page.locator("#latest-throughput")).to_contain_text(" tok/s")
    expect(page.locator("#latest-accept")).to_contain_text("tokens/step", timeout=10_000)
    expect(page.locator("#latest-latency")).to_contain_text(" ms")
    expect(page.locator("#latest-gpu-util")).to_have_text("no GPU telemetry on this host")
    first = _stats(page)
    page.wait_for_timeout(8_000)
    later = _stats(page)
    assert later["pushes"] - first["pushes"] >= 6  # about one point a second arrived
    assert later["draws"] > first["draws"] and later["points"] > first["points"]
    print(f"charts, live: {later['draws']} redraws, {later['drawMs'] / later['draws']:.2f} ms "
          f"each on average, {later['maxDrawMs']:.2f} ms at most")
    # Drawing seven charts per point stays far inside a frame.
    assert later["drawMs"] / later["draws"] < 16 and later["maxDrawMs"] < 100
    expect(page.locator(".chart .u-over").first).to_be_visible()
    expect(page.locator("#alerts")).to_be_hidden()
    page.wait_for_timeout(15_000)  # a fuller picture for the screenshot
    page.screenshot(path=screenshot_path("metrics-ready.png"), full_page=True)
    _keeps_up_with_a_full_window(page)

    page.goto(f"{stack}/deployments/{collapsing}/")
    expect(page.locator("#status")).to_have_text("ready", timeout=60_000)
    expect(_alert(page, "accept-collapse")).to_contain_text("fell to", timeout=90_000)
    expect(page.locator("#alerts")).to_be_visible()

    # Stopped, its page shows the figures as last seen, never as live: at the stop, and after.
    page.goto(f"{stack}/deployments/{healthy}/")
    page.click("#stop")
    page.click("#confirm")
    expect(page.locator("#status")).to_have_text("stopped", timeout=30_000)
    expect(page.locator("#conn")).to_have_text("ended")
    for _ in range(2):
        expect(page.locator("#decode-source")).to_contain_text(
            re.compile(r"^last seen at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, before the engine "
                       r"stopped; not live$"))
        expect(page.locator("#charts-title")).to_contain_text("not live")
        page.reload()


def _keeps_up_with_a_full_window(page: Page) -> None:
    """Fifteen minutes of points at one a second (the window's most), then one more a
    frame: the charts hold the whole window. How long a redraw takes is printed; its target (under a frame's 16 ms) is checked by bench/log_history.py, as
    a browser beside the whole suite's other stacks is slowed by more than its margin."""
    took = page.evaluate(FULL_WINDOW_REDRAW)
    print(f"charts: redrawing 7 charts of {took['points']} points took {took['mean']:.2f} ms "
          f"on average, {took['max']:.2f} ms at most")
    assert took["points"] >= 900


def test_silent_eager_decoding_and_a_stalled_capture_alert_in_the_panel(  # type: ignore[no-untyped-def]
        stack, eager_and_stalled, page):
    eager, stalled = eager_and_stalled
    login(page, stack)
    page.goto(f"{stack}/deployments/{stalled}/")
    expect(page.locator("#status")).to_have_text("capturing", timeout=90_000)
    expect(_alert(page, "stall")).to_contain_text("No progress for", timeout=30_000)
    expect(_alert(page, "stall")).to_contain_text("while capturing")

    page.goto(f"{stack}/deployments/{eager}/")
    expect(page.locator("#status")).to_have_text("ready", timeout=60_000)
    expect(_alert(page, "silent-eager")).to_be_visible(timeout=60_000)
    expect(page.locator("#stat-cuda_graph")).to_have_text("no (eager)", timeout=20_000)
    # The alert is kept as an event: a fresh page replays it.
    page.reload()
    expect(_alert(page, "silent-eager")).to_be_visible(timeout=20_000)
