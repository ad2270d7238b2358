"""The detail page's charts read time as the rest of the page does, 24-hour UTC, in a
browser whose own zone is another (Chromium -> uvicorn panel -> PostgreSQL)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect, sync_playwright

from appliance.runtime import series
from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.screenshots import screenshot_path
from tests.e2e.stack import login
from tests.servers import panel_server
from tests.specs import spec
from web.deployments import services
from web.deployments.models import MetricPoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
TICK = re.compile(r"^([01]\d|2[0-3]):[0-5]\d(:[0-5]\d)?$")


@pytest.fixture
def serving(operator) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """A ready deployment with ten minutes of points at 2 s; returns its id and the last t."""
    pk = services.deployment_create(data=spec(name="charted"), confirm_warnings=True).pk
    services.deployment_mark_starting(deployment_id=pk, image="engine:test")
    services.deployment_mark_ready(deployment_id=pk, engine_url="http://appliance-engine-c:30000")
    end = timezone.now().timestamp()
    MetricPoint.objects.bulk_create(
        [MetricPoint.of(pk, series.MetricPoint(t=end - 600 + 2 * i, throughput=300.0 + i % 9,
                                               accept_len=4.5, running=2.0), 2)
         for i in range(300)])
    return pk, end


@pytest.fixture
def los_angeles_page(tmp_path: Path) -> Iterator[Page]:
    """Chromium in a zone eight hours off UTC: a local-time axis would show it."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 1000},
                                      timezone_id="America/Los_Angeles")
        yield context.new_page()
        browser.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with panel_server(tmp_path / "web.log") as url:
        yield url


def _utc_minutes(start: float, end: float) -> set[str]:
    minute = int(start // 60) * 60
    return {datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M")
            for t in range(minute, int(end) + 60, 60)}


def test_the_time_axes_are_24_hour_utc_in_any_browser_zone(  # type: ignore[no-untyped-def]
        serving, server, los_angeles_page: Page) -> None:
    pk, end = serving
    page = los_angeles_page
    assert page.evaluate("new Date(0).getTimezoneOffset()") == 480  # the browser is not on UTC
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    login(page, server)
    page.goto(f"{server}/deployments/{pk}/")
    expect(page.locator("#charts")).to_be_visible(timeout=20_000)
    expect(page.locator("#latest-throughput")).to_contain_text(" tok/s")
    page.wait_for_function("ApplianceCharts.ticks('throughput').length > 0")
    ticks = page.evaluate("ApplianceCharts.ticks('throughput')")
    assert all(TICK.match(t) for t in ticks), ticks
    # The UTC minutes of the data, not Los Angeles's (eight hours earlier).
    assert set(t[:5] for t in ticks) <= _utc_minutes(end - 600, end), ticks
    legend = page.locator("#chart-throughput .u-legend").inner_text()
    assert not re.search(r"\d+/\d+/\d+|[ap]m\b", legend), legend
    assert not errors
    page.screenshot(path=screenshot_path("charts-utc-axes.png"), full_page=True)
