"""End-to-end fixtures: Docker (tests.conftest_docker) and a Chromium page."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401

CHROMIUM = os.environ.get("APPLIANCE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic",
]


LOG_TAIL_LINES = 60
_CALL_FAILED = pytest.StashKey[bool]()  # set by the hook below: the test's own call failed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page of Debian's Chromium, driven by Playwright (no browser download). When the test
    fails, the page's URL, its status and live-feed state, and the tails of the stack's logs
    (worker, agent, panel: appliance_stack writes them under tmp_path) are printed with the
    failure, so a failure seen once in CI can be read afterwards."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        the_page = context.new_page()
        yield the_page
        if request.node.stash.get(_CALL_FAILED, False):
            _print_failure_context(the_page, request.node.funcargs.get("tmp_path"))
        browser.close()


def _print_failure_context(page: Page, tmp_path: Path | None) -> None:
    try:
        shown = {}
        for selector in ("#status", "#conn"):  # the deployment's status, its live feed's
            found = page.locator(selector)
            shown[selector] = found.first.inner_text(timeout=1000) if found.count() else None
        print(f"page {page.url}: {shown}")
    except Exception as exc:  # noqa: BLE001 (the failure itself is what matters)
        print(f"page state unreadable: {exc}")
    for log in sorted(tmp_path.glob("*.log")) if tmp_path else []:
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        print(f"----- {log.name} (last {len(lines)} lines)")
        print("\n".join(lines))
