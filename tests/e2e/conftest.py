"""End-to-end fixtures: Docker (tests.conftest_docker) and a Chromium page."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from playwright.sync_api import Page, Route, sync_playwright

from docker import from_env
from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401
from tests.servers import panel_server

CHROMIUM = os.environ.get("APPLIANCE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic",
]


LOG_TAIL_LINES = 60
AGENT_SILENT_S = 30  # the shared panel's (APPLIANCE_AGENT_SILENT_S): an agent silent this long
_SHARED_LOGS: list[Path] = []  # the shared panel's log, printed with its tests' failures


@pytest.fixture(scope="session")
def shared_panel(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One panel (uvicorn, on the test database) for the browser tests that need the panel
    alone and write their rows themselves (each test's rows are emptied after it, the panel
    keeps nothing of them between requests): started once, not once per test."""
    log = tmp_path_factory.mktemp("shared-panel") / "shared-panel.log"
    with panel_server(log, APPLIANCE_AGENT_SILENT_S=str(AGENT_SILENT_S)) as url:
        _SHARED_LOGS.append(log)
        yield url
        _SHARED_LOGS.remove(log)


@pytest.fixture(scope="session")
def trial_images() -> Iterator[set[str]]:
    """The images the session's trials built (tests/e2e/test_fleet_trial.py: the panel's and
    the simulated host's, tagged with this session's project): kept from one trial test to
    the next, whose `up --build` then finds every layer built, and removed when the session
    ends."""
    images: set[str] = set()
    yield images
    client = from_env()
    for image in images:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image, force=True)
    client.close()


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
    fails, the page's URL, its status and live-feed state, the requests it made that got no
    answer yet (and for how long), its script errors, and the tails of the stack's logs
    (worker, agent, panel: appliance_stack writes them under tmp_path) are printed with the
    failure, so a failure seen once in CI can be read afterwards."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        context.route("**/static/**", _static_outside_chromium)
        the_page = context.new_page()
        seen = _PageRecord(the_page)
        yield the_page
        if request.node.stash.get(_CALL_FAILED, False):
            _print_failure_context(the_page, request.node.funcargs.get("tmp_path"),
                                   "shared_panel" in request.node.fixturenames)
            seen.print()
        browser.close()


def _static_outside_chromium(route: Route) -> None:
    """Chromium drops the requests it has in flight when the machine's network interfaces
    change, net::ERR_NETWORK_CHANGED (Chromium issue 41465264), and Docker adds and removes
    interfaces as the suite's containers start and stop. A detail page whose detail.js was
    dropped so stayed 'connecting…' (two fresh-clone runs, 2026-12-07). The panel's static
    files are fetched by Playwright's own client, which that does not touch, and handed to
    the page as the panel answered them (status, headers, body)."""
    route.fulfill(response=route.fetch(max_retries=3))


class _PageRecord:
    """What the page's scripts met, kept for a failure's report: the requests that got no
    answer yet (how long each has waited), the failed ones, script errors and console
    errors, each with the time since the page fixture started."""

    def __init__(self, page: Page) -> None:
        self.start = time.monotonic()
        self.pending: dict[Any, tuple[str, float]] = {}
        self.notes: list[str] = []
        page.on("request", lambda r: self.pending.__setitem__(r, (r.url, self._now())))
        page.on("response", lambda r: self.pending.pop(r.request, None))
        page.on("requestfailed", lambda r: (self.pending.pop(r, None), self._note(
            f"request failed: {r.url} ({r.failure})")))
        page.on("pageerror", lambda e: self._note(f"script error: {e}"))
        page.on("console", lambda m: m.type == "error" and self._note(f"console: {m.text}"))

    def _now(self) -> float:
        return time.monotonic() - self.start

    def _note(self, text: str) -> None:
        self.notes.append(f"{self._now():7.1f}s {text}")

    def print(self) -> None:
        now = self._now()
        for url, since in self.pending.values():
            print(f"no answer yet after {now - since:.1f} s (asked at {since:.1f} s): {url}")
        for note in self.notes[-20:]:
            print(note)


def _print_failure_context(page: Page, tmp_path: Path | None, shared_panel: bool) -> None:
    try:
        shown = {}
        for selector in ("#status", "#conn"):  # the deployment's status, its live feed's
            found = page.locator(selector)
            shown[selector] = found.first.inner_text(timeout=1000) if found.count() else None
        print(f"page {page.url}: {shown}")
    except Exception as exc:  # noqa: BLE001 (the failure itself is what matters)
        print(f"page state unreadable: {exc}")
    shared = _SHARED_LOGS if shared_panel else []
    for log in [*(sorted(tmp_path.glob("*.log")) if tmp_path else []), *shared]:
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        print(f"----- {log.name} (last {len(lines)} lines)")
        print("\n".join(lines))
