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
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import MetricPoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
TICK = re.compile(r"^([01]\d|2[0-3]):[0-5]\d(:[0-5]\d)?$")


@pytest.fixture
def serving(operator) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """A ready deployment with ten minutes of points at 2 s across the last UTC midnight
    (the axis marks the day there); returns its id and the last t."""
    pk = deploying.deployment_create(data=spec(name="charted"), confirm_warnings=True).pk
    services.deployment_mark_starting(deployment_id=pk, image="engine:test")
    services.deployment_mark_ready(deployment_id=pk, engine_url="http://appliance-engine-c:30000")
    now = timezone.now().timestamp()
    end = (now - 600) // 86400 * 86400 + 300  # 23:55 to 00:05 UTC, before now
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
def server(shared_panel: str) -> str:
    return shared_panel


def _utc_labels(start: float, end: float) -> set[str]:
    """What a tick may read for the data's span: its UTC minutes, and at a UTC midnight
    inside it the UTC date as MM-DD (the axis's day mark; Los Angeles is still on the day
    before there)."""
    minute = int(start // 60) * 60
    times = [datetime.fromtimestamp(t, tz=UTC) for t in range(minute, int(end) + 60, 60)]
    return ({t.strftime("%H:%M") for t in times}
            | {t.strftime("%m-%d") for t in times if (t.hour, t.minute) == (0, 0)})


def test_the_time_axes_are_24_hour_utc_in_any_browser_zone(  # type: ignore[no-untyped-def]
        serving, server, los_angeles_page: Page) -> None:
    pk, end = serving
    page = los_angeles_page
    assert page.evaluate("new Date(0).getTimezoneOffset()") == 480  # the browser is not on UTC
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    login(page, server)
    page.clock.set_system_time(end + 60)  # the page asks for the 15 minutes before its clock
    page.goto(f"{server}/deployments/{pk}/")
    expect(page.locator("#charts")).to_be_visible(timeout=20_000)
    expect(page.locator("#latest-throughput")).to_contain_text(" tok/s")
    page.wait_for_function("ApplianceCharts.ticks('throughput').length > 0")
    ticks = page.evaluate("ApplianceCharts.ticks('throughput')")
    labels = _utc_labels(end - 600, end)
    assert all(TICK.match(t) or t in labels for t in ticks), ticks
    # The UTC minutes (and date) of the data, not Los Angeles's (eight hours earlier).
    assert set(t[:5] for t in ticks) <= labels, ticks
    midnight = datetime.fromtimestamp(end - 300, tz=UTC).strftime("%m-%d")
    assert midnight in ticks, ticks  # the UTC day's mark, where Los Angeles is at 16:00
    legend = page.locator("#chart-throughput .u-legend").inner_text()
    assert not re.search(r"\d+/\d+/\d+|[ap]m\b", legend), legend
    assert not errors
    page.screenshot(path=screenshot_path("charts-utc-axes.png"), full_page=True)
