"""End-to-end fixtures: Docker (tests.conftest_docker) and a Chromium page."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401

CHROMIUM = os.environ.get("APPLIANCE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic",
]


@pytest.fixture
def page() -> Iterator[Page]:
    """A page of Debian's Chromium, driven by Playwright (no browser download)."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        yield context.new_page()
        browser.close()
