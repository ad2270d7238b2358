"""A deployment on the replay of the real engine's DDTree run (433c58ed7, triton, one H200;
tests/fixtures/real-engine): the test engine prints what SGLang printed and serves the
/metrics it served, on a clock 4x faster with no gap over 2 s (a 137 s cold start in about
18 s). The detail page must read the real output right: the phases up to ready, the
captured widths 33 (target verify) and 8 (draft), charts with points, and no alert or
failure diagnosis, though the real engine's `sglang:is_cuda_graph` gauge reads 0 once idle.
What the engine warned of that changes what runs is a finding on the page: the recording's
`Max running requests is reset to 48 for speculative decoding` (the spec sets none)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.screenshots import screenshot_path
from tests.e2e.stack import appliance_stack, login
from tests.specs import spec
from web.deploy import services as deploying
from web.deployments.models import Deployment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]

RUN = "433c58ed7/ddtree_triton"
RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-engine"
REPLAY_ENV = f"TEST_ENGINE_REPLAY={RUN},TEST_ENGINE_REPLAY_SPEED=4,TEST_ENGINE_REPLAY_MAX_GAP_S=2"


def _last_replayed_line(run: str = RUN) -> str:
    """The recording's last line before the recorder stopped the engine."""
    with open(RECORDINGS / run / "engine.log", encoding="utf-8", newline="\n") as log:
        lines = [row.rstrip("\n")[31:] for row in log]
    stop = next(i for i, line in enumerate(lines) if "SIGTERM received" in line)
    return lines[stop - 1]


@pytest.fixture
def replayed(operator, tmp_path: Path, test_engine_image: str,  # type: ignore[no-untyped-def]
             settings) -> Iterator[tuple[str, int]]:
    settings.ENGINE_GPU_REQUESTS = False
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": REPLAY_ENV, "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
           "APPLIANCE_METRICS_INTERVAL_S": "1"}
    # The recorded run's own settings: DDTREE budget 32, block 8, triton, overlap scheduler.
    data = spec(name="real-ddtree-replay", self_check=False, engine__attention_backend="triton")
    data["engine"].pop("disable_overlap_schedule")
    with appliance_stack(tmp_path, env) as url:
        # Made before the page: Playwright's loop makes the ORM refuse afterwards.
        yield url, deploying.deployment_create(data=data, confirm_warnings=True).pk


def _row(page: Page, role: str):  # type: ignore[no-untyped-def]
    return page.locator(f'#capture-widths tr[data-role="{role}"]')


def test_the_real_ddtree_run_replayed_reads_right_on_the_detail_page(  # type: ignore[no-untyped-def]
        replayed, page):
    url, pk = replayed
    login(page, url)
    page.goto(f"{url}/deployments/{pk}/")
    expect(page.locator("#log")).to_contain_text("a simulator, not SGLang", timeout=60_000)
    expect(_row(page, "target").locator(".captured")).to_have_text("33 tokens/request",
                                                                   timeout=60_000)
    expect(_row(page, "draft").locator(".captured")).to_have_text("8 tokens/request",
                                                                  timeout=60_000)
    expect(page.locator("#capture-widths tr.mismatch")).to_have_count(0)
    expect(page.locator("#status")).to_have_text("ready", timeout=60_000)
    for phase in ("starting", "loading", "capturing"):
        expect(page.locator(f"#timeline li[data-phase={phase}]")).to_have_class("done")
    expect(page.locator("#log")).to_contain_text("fired up and ready to roll")
    # The recorded load (bench at 1, 8 and 32): the random drafter's real acceptance, about
    # 1.1 tokens per step; then idle, and the charts hold the load's points.
    expect(page.locator("#stat-accept_len")).to_have_text(re.compile(r"^1\.\d\d$"),
                                                           timeout=30_000)
    expect(page.locator("#log")).to_contain_text(_last_replayed_line(), timeout=60_000)
    page.wait_for_timeout(6_000)  # idle scrapes: the gauge reads 0, the pass counters stand
    assert page.evaluate("ApplianceCharts.stats()")["points"] >= 5
    expect(page.locator("#stat-cuda_graph")).not_to_have_text("no (eager)")
    # The random drafter accepts about 1.1 tokens a step, below every break-even recorded:
    # the acceptance alert names the drafter and the fix (the recording, not a guess, says so).
    low = page.locator("#alerts li", has_text="accept-low")
    expect(low).to_contain_text("/models/Kimi-K2.6-DFlash")
    expect(low).to_contain_text("speculative_draft_model_path")
    expect(page.locator("#diagnosis")).to_be_hidden()
    cap = page.locator('#finding-list li[data-cause="max-running-requests-reset"]')
    expect(cap).to_contain_text("at most 48 requests at once")
    expect(cap).to_contain_text("engine.max_running_requests")
    expect(cap.locator("b")).to_have_text("info")
    page.reload()  # the page names the stored findings on load too
    expect(cap).to_have_count(1)
    page.screenshot(path=screenshot_path("replay-real-ddtree.png"), full_page=True)
    stored = _in_thread(_stored, pk)
    assert {a.get("id") for a in stored["alerts"]} == {"accept-low"}, stored["alerts"]
    assert [d for d in stored["diagnoses"] if not d.get("severity")] == [], stored["diagnoses"]
    assert [d["cause"] for d in stored["diagnoses"]] == ["max-running-requests-reset"]
    assert stored["busy_points"] > 0, "no point of the recorded load reached the series"
    assert stored["status"] == "ready"


def _stored(pk: int) -> dict[str, Any]:
    from django.db import connection

    try:
        deployment = Deployment.objects.get(pk=pk)
        events = deployment.events
        return {
            "status": deployment.status,
            "alerts": [e.payload for e in events.filter(kind="alert")],
            "diagnoses": [e.payload for e in events.filter(kind="diagnosis")],
            "busy_points": deployment.metric_points.filter(throughput__gt=0).count(),
        }
    finally:
        connection.close()  # this thread's own connection: the test database is dropped after


def _in_thread(fn, *args):  # type: ignore[no-untyped-def]
    """The ORM refuses calls from Playwright's event loop thread; a worker thread is fine."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


SECOND_ROUND = "TEST_ENGINE_REPLAY_SPEED=4,TEST_ENGINE_REPLAY_MAX_GAP_S=2"
NOGRAPH = "433c58ed7/ddtree_nograph"


@pytest.fixture
def second_round(operator, tmp_path: Path, test_engine_image: str,  # type: ignore[no-untyped-def]
                 settings) -> Iterator[tuple[str, int, int]]:
    """Two replays of the rig's second round, each with its recorded run's own settings:
    DFLASH at 4 draft tokens on a block-8 drafter, DDTREE with CUDA graphs off by the spec."""
    settings.ENGINE_GPU_REQUESTS = False
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": SECOND_ROUND, "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
           "APPLIANCE_METRICS_INTERVAL_S": "1"}
    block = spec(name="real-dflash-block4", self_check=False, recipe="kimi-k2.6-dflash",
                 engine__speculative_algorithm="DFLASH", engine__speculative_num_draft_tokens=4,
                 engine__attention_backend="triton",
                 env={"TEST_ENGINE_REPLAY": "433c58ed7/dflash_block4"})
    block["engine"].pop("speculative_ddtree_budget")
    nograph = spec(name="real-ddtree-nograph", self_check=False, gpus=[1],
                   engine__attention_backend="triton", engine__disable_cuda_graph=True,
                   env={"TEST_ENGINE_REPLAY": NOGRAPH})
    for data in (block, nograph):
        data["engine"].pop("disable_overlap_schedule")
    with appliance_stack(tmp_path, env) as url:
        yield (url, deploying.deployment_create(data=block, confirm_warnings=True).pk,
               deploying.deployment_create(data=nograph, confirm_warnings=True).pk)


def test_the_second_rounds_block_size_warning_and_graphs_off_read_right_on_the_page(  # type: ignore[no-untyped-def]
        second_round, page):
    url, block, nograph = second_round
    login(page, url)
    page.goto(f"{url}/deployments/{block}/")
    mismatch = page.locator('#finding-list li[data-cause="dflash-block-size-mismatch"]')
    expect(mismatch.locator("b")).to_have_text("warning", timeout=90_000)
    expect(mismatch).to_contain_text("4 draft tokens per block")
    expect(mismatch).to_contain_text("trained with block size 8")
    expect(mismatch.locator(".fix")).to_contain_text("engine.speculative_num_draft_tokens")
    expect(page.locator("#status")).to_have_text("ready", timeout=90_000)
    expect(page.locator("#diagnosis")).to_be_hidden()
    page.screenshot(path=screenshot_path("replay-real-dflash-block4.png"), full_page=True)

    page.goto(f"{url}/deployments/{nograph}/")
    note = page.locator('#alert-list [data-alert="eager-by-spec"]')
    expect(note).to_have_class(re.compile(r"severity-info"), timeout=120_000)
    expect(note).to_contain_text("off by the spec")
    expect(note).to_contain_text("per output token")
    # The whole recorded load played (bench at 1 and 8, every decode pass eager): graphs off
    # by the spec stay a note, never silent-eager. The run's random drafter accepted 1.0 to
    # 1.3 tokens a step (its /metrics), below LOW_ACCEPT_LEN: accept-low is the recording's
    # due, raised once the load's points are scraped (when depends on the machine's pace).
    expect(page.locator("#log")).to_contain_text(_last_replayed_line(NOGRAPH),
                                                 timeout=120_000)
    expect(page.locator('#alert-list [data-alert="accept-low"]')).to_have_count(1,
                                                                            timeout=30_000)
    expect(page.locator('#alert-list [data-alert="silent-eager"]')).to_have_count(0)
    page.screenshot(path=screenshot_path("replay-real-ddtree-nograph.png"), full_page=True)
    stored = _in_thread(_stored, nograph)
    assert [a["id"] for a in stored["alerts"]] == ["eager-by-spec", "accept-low"], \
        stored["alerts"]
