"""The deployments list in a real browser (Chromium -> uvicorn panel -> PostgreSQL): it
refreshes itself, so a deployment that becomes ready, stops or is created shows without a
reload, with its uptime, current throughput and endpoint."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from appliance.runtime import series
from tests.e2e.screenshots import screenshot_path
from tests.e2e.stack import login, meanwhile
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.models import MetricPoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


@pytest.fixture
def server(shared_panel: str) -> str:
    return shared_panel


def _create(name: str, gpu: int) -> int:
    return deploying.deployment_create(data=spec(name=name, gpus=[gpu]), confirm_warnings=True).pk


def _serve(pk: int, throughput: float) -> None:
    services.deployment_mark_starting(deployment_id=pk, image="engine:test")
    services.deployment_mark_ready(deployment_id=pk, engine_url="http://appliance-engine-a:30000")
    point = series.MetricPoint(t=timezone.now().timestamp(), throughput=throughput)
    MetricPoint.of(pk, point, 2).save()


# Made before the page (the fixtures run in the order the test names them).
@pytest.fixture
def first(operator) -> int:  # type: ignore[no-untyped-def]
    return _create("first", gpu=0)


def test_the_list_follows_deployments_without_a_reload(server, first: int, page: Page) -> None:  # type: ignore[no-untyped-def]
    login(page, server)
    row = page.locator(f"#deployment-{first}")
    expect(row.locator(".status")).to_have_text("queued")
    expect(row.locator(".uptime")).to_have_text("–")

    second: list[int] = []
    meanwhile(lambda: (_serve(first, 321.5), second.append(_create("second", gpu=1))))
    expect(row.locator(".status")).to_have_text("ready", timeout=15_000)
    expect(row.locator(".throughput")).to_have_text("321.5 tok/s")
    expect(row.locator(".endpoint")).to_have_text(f"{server}/v1 model first")
    expect(row.locator(".uptime")).to_have_text(re.compile(r"^\d+ s$"))
    expect(page.locator(f"#deployment-{second[0]} .status")).to_have_text("queued")
    expect(page.locator("#list-refreshed")).to_contain_text("refreshed ")
    page.screenshot(path=screenshot_path("list-refreshed.png"), full_page=True)

    meanwhile(lambda: (services.deployment_mark_stopping(deployment_id=first),
                        services.deployment_mark_stopped(deployment_id=first)))
    expect(row.locator(".status")).to_have_text("stopped", timeout=15_000)
    expect(row.locator(".throughput")).to_have_text("–")
    expect(row.locator(".endpoint")).to_have_text("–")
    stats = page.evaluate("ApplianceList.stats()")
    assert stats["refreshes"] >= 2 and stats["failures"] == 0
    # The links still lead to the detail page.
    row.locator("td.id a").click()
    expect(page).to_have_url(f"{server}/deployments/{first}/")
