"""An alert on the detail page says when it was raised, and when it clears it stays, marked
cleared with the time, live and after a reload (Chromium -> uvicorn panel -> PostgreSQL ->
Redis -> SSE)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from appliance.runtime.alerts import Alert
from tests.e2e.stack import login, meanwhile
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.services.metrics import deployment_apply_alerts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
UTC_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


@pytest.fixture
def server(shared_panel: str, live_channel) -> str:  # type: ignore[no-untyped-def]
    return shared_panel


@pytest.fixture
def loading(operator) -> int:  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(name="slow"), confirm_warnings=True).pk
    services.deployment_mark_starting(deployment_id=pk, image="engine:test")
    services.deployment_mark_loading(deployment_id=pk)
    return pk


def test_an_alert_shows_when_it_was_raised_and_cleared(server, loading: int, page: Page) -> None:  # type: ignore[no-untyped-def]
    login(page, server)
    page.goto(f"{server}/deployments/{loading}/")
    expect(page.locator("#status")).to_have_text("loading")
    expect(page.locator("#alerts")).to_be_hidden()
    stall = page.locator('#alerts li[data-alert="stall"]')

    meanwhile(lambda: deployment_apply_alerts(deployment_id=loading, alerts=[
        Alert("stall", "firing", "warning", "No progress for 300 s while loading.")]))
    expect(stall.locator(".summary")).to_have_text("No progress for 300 s while loading.",
                                                   timeout=15_000)
    expect(stall.locator(".when")).to_have_text(re.compile(f"^raised {UTC_TIME}$"))
    raised = stall.locator(".when").inner_text()

    meanwhile(lambda: deployment_apply_alerts(deployment_id=loading, alerts=[
        Alert("stall", "resolved", "warning", "The engine is making progress again.")]))
    expect(stall).to_have_class(re.compile(r"\bcleared\b"), timeout=15_000)
    expect(stall.locator(".when")).to_have_text(re.compile(
        f"^{re.escape(raised)} · cleared {UTC_TIME}: The engine is making progress again\\.$"))
    live_text = stall.inner_text()
    page.reload()
    expect(stall).to_have_class(re.compile(r"\bcleared\b"))
    assert stall.inner_text() == live_text  # the server renders what the live update showed
