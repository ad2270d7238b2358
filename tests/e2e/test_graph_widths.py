"""While an engine captures its CUDA graphs the detail page shows each role's captured verify
width beside the width the spec needs (DDTree: target budget+1 = 33, draft the block, 8), and
a width that disagrees is a finding at capture time, before the first request.

The right-width engine's drafter says block size 16 in its config (TEST_ENGINE_DRAFTER_BLOCK_SIZE:
the test engine prints 433c58ed7's `DFLASH block size mismatch` line from the source text,
speculative/dflash_worker_v2.py, until a recording has it): a warning finding on the page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.stack import appliance_stack, login
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]


@pytest.fixture
def deployments(operator, tmp_path: Path, test_engine_image: str,  # type: ignore[no-untyped-def]
                settings) -> Iterator[tuple[str, int, int]]:
    settings.ENGINE_GPU_REQUESTS = False
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.08,TEST_ENGINE_SHARDS=6",
           "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5"}
    with appliance_stack(tmp_path, env) as url:
        # Made before the page: Playwright's loop makes the ORM refuse afterwards.
        right = deploying.deployment_create(
            data=spec(name="widths-right", self_check=False,
                      env={"TEST_ENGINE_DRAFTER_BLOCK_SIZE": "16"}),
            confirm_warnings=True).pk
        wrong = deploying.deployment_create(
            data=spec(name="widths-wrong", self_check=False, gpus=[1],  # GPU 0 is leased
                      env={"TEST_ENGINE_FAIL": "ddtree-width"}),  # the PR head's capture
            confirm_warnings=True).pk
        yield url, right, wrong


def _row(page: Page, role: str):  # type: ignore[no-untyped-def]
    return page.locator(f'#capture-widths tr[data-role="{role}"]')


def test_captured_widths_show_beside_the_needed_ones_and_a_difference_is_found_at_once(  # type: ignore[no-untyped-def]
        deployments, page):
    url, right, wrong = deployments
    login(page, url)
    page.goto(f"{url}/deployments/{right}/")
    expect(_row(page, "target")).to_contain_text("33 tokens/request")
    expect(_row(page, "target").locator(".captured")).to_have_text("33 tokens/request",
                                                                   timeout=90_000)
    expect(_row(page, "draft").locator(".captured")).to_have_text("8 tokens/request",
                                                                  timeout=60_000)
    expect(page.locator("#status")).to_have_text("ready", timeout=60_000)
    expect(page.locator("#capture-widths tr.mismatch")).to_have_count(0)
    expect(page.locator("#diagnosis")).to_be_hidden()
    block = page.locator('#finding-list li[data-cause="dflash-block-size-mismatch"]')
    expect(block.locator("b")).to_have_text("warning")
    expect(block).to_contain_text("8 draft tokens per block")
    expect(block).to_contain_text("trained with block size 16")
    expect(block.locator(".fix")).to_contain_text(
        "Block size in the form (spec key engine.speculative_num_draft_tokens), now 8")

    page.goto(f"{url}/deployments/{wrong}/")
    target = _row(page, "target")
    expect(target.locator(".captured")).to_have_text("8 tokens/request", timeout=90_000)
    expect(target).to_have_class("mismatch")
    # The test engine then crashes on its first request as the PR head does (its warm-up
    # request comes within a second); the finding was stored with the capture line, first.
    expect(page.locator("#status")).to_have_text("failed", timeout=60_000)
    expect(page.locator("#diag-cause")).to_have_text("ddtree-verify-width")
    diagnoses, capture_seq = _in_thread(_diagnoses_and_capture, wrong)
    causes = [p["cause"] for _, p in diagnoses]
    assert causes[0] == "graph-width-mismatch" and diagnoses[0][1]["fatal"] is False
    assert "ddtree-verify-width" in causes[1:], causes
    assert diagnoses[0][1]["evidence"] == {"role": "target", "captured_width": 8,
                                           "needed_width": 33}
    assert diagnoses[0][0] == capture_seq + 1, "the finding comes right after the capture line"


def _diagnoses_and_capture(pk: int) -> tuple[list[tuple[int, dict]], int]:
    from django.db import connection

    try:
        events = Deployment.objects.get(pk=pk).events
        diagnoses = [(e.seq, e.payload) for e in events.filter(kind="diagnosis").order_by("seq")]
        capture = events.filter(kind="progress", payload__kind="capture_begin").order_by("seq")[0]
        return diagnoses, capture.seq
    finally:
        connection.close()  # this thread's own connection: the test database is dropped after


def _in_thread(fn, *args):  # type: ignore[no-untyped-def]
    """The ORM refuses calls from Playwright's event loop thread; a worker thread is fine."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()
