"""The detail page goes live even when one of its requests gets no answer (Chromium -> uvicorn
panel -> PostgreSQL -> Redis -> SSE): the build and self-check cards' request is given up
after its bound, and a live stream the panel has not opened by its bound is asked for again;
either way what happens next (an alert) is shown without a reload."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, Route, expect

from appliance.runtime.alerts import Alert
from tests.e2e.stack import login, meanwhile
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments import services
from web.deployments.services.metrics import deployment_apply_alerts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
CARDS_WAIT_S = 10  # detail.js CARDS_WAIT_MS
STREAM_OPEN_S = 15  # detail.js STREAM_OPEN_MS


@pytest.fixture
def loading(operator, live_channel) -> int:  # type: ignore[no-untyped-def]
    pk = deploying.deployment_create(data=spec(name="slow"), confirm_warnings=True).pk
    services.deployment_mark_starting(deployment_id=pk, image="engine:test")
    services.deployment_mark_loading(deployment_id=pk)
    return pk


def _alert_shows_live(page: Page, pk: int) -> None:
    meanwhile(lambda: deployment_apply_alerts(deployment_id=pk, alerts=[
        Alert("stall", "firing", "warning", "No progress for 300 s while loading.")]))
    expect(page.locator('#alerts li[data-alert="stall"] .summary')).to_have_text(
        "No progress for 300 s while loading.", timeout=15_000)


def test_a_cards_request_with_no_answer_is_given_up_and_the_page_goes_live(
        shared_panel: str, loading: int, page: Page) -> None:
    asked: list[Route] = []
    login(page, shared_panel)
    page.route(lambda url: "/events/?kind=build,selfcheck" in url,
               lambda route: asked.append(route))  # never answered
    start = time.monotonic()
    page.goto(f"{shared_panel}/deployments/{loading}/")
    expect(page.locator("#conn")).to_have_text("live", timeout=(CARDS_WAIT_S + 10) * 1000)
    assert len(asked) == 1, "the cards were asked for once"
    assert time.monotonic() - start >= CARDS_WAIT_S - 1, "live only once the request was given up"
    _alert_shows_live(page, loading)


def test_a_stream_the_panel_never_opens_is_asked_for_again(
        shared_panel: str, loading: int, page: Page) -> None:
    streams: list[str] = []

    def first_hangs(route: Route) -> None:
        streams.append(route.request.url)
        if len(streams) > 1:
            route.continue_()  # the first is left unanswered, as a stuck connection leaves it

    login(page, shared_panel)
    page.route(lambda url: "/events/stream/" in url, first_hangs)
    page.goto(f"{shared_panel}/deployments/{loading}/")
    expect(page.locator("#conn")).to_have_text("live", timeout=(STREAM_OPEN_S + 15) * 1000)
    assert len(streams) == 2, streams
    assert streams[1] == streams[0], "asked again from the same seq (nothing came meanwhile)"
    _alert_shows_live(page, loading)


def test_a_stream_answered_with_an_error_is_asked_for_again(
        shared_panel: str, loading: int, page: Page) -> None:
    """An error status (a loaded panel's 500 or 503) ends an EventSource for good: the page,
    not the browser, asks again, and goes live (a CI run's page stayed `connecting…`)."""
    streams: list[str] = []

    def first_refused(route: Route) -> None:
        streams.append(route.request.url)
        if len(streams) == 1:
            route.fulfill(status=503, content_type="text/plain", body="busy")
        else:
            route.continue_()

    login(page, shared_panel)
    page.route(lambda url: "/events/stream/" in url, first_refused)
    page.goto(f"{shared_panel}/deployments/{loading}/")
    expect(page.locator("#conn")).to_have_text("live", timeout=STREAM_OPEN_S * 1000)
    assert len(streams) == 2, streams
    assert streams[1] == streams[0], "asked again from the same seq (nothing came meanwhile)"
    _alert_shows_live(page, loading)
