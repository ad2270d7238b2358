"""The predicted weight load time, as a user sees it (so a load is never a wait in the dark):
the form offers a store entry with its expected weight load (its size over the root's measured
read rate), the deployment made from that entry starts the test engine, and the Weights card
gives the GB/s the load reached against the disk's rate. Real stack: worker, agent and panel as
processes, the test engine in Docker, Chromium; the root is a real folder on this disk with a
128 MiB checkpoint."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from playwright.sync_api import Page, expect

from tests.e2e.stack import appliance_stack, login
from tests.models import safetensors_bytes, write_model
from web.store.loadtime import root_read_rate_measure
from web.store.services.scan import model_store_scan

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.e2e]
VALUES = 32 * 1024**2  # float32 zeros: a 128 MiB shard


@pytest.fixture
def measured_root(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A root the store has scanned and whose read rate was measured (before the browser:
    the ORM stays out of Playwright's loop)."""
    root = tmp_path / "models"
    folder = write_model(root / "Llama-128M", {"architectures": ["LlamaForCausalLM"],
                                               "model_type": "llama"})
    (folder / "model.safetensors").write_bytes(safetensors_bytes(VALUES))
    with override_settings(MODEL_ROOTS=[str(root)]):
        [entry] = model_store_scan()
        rate = root_read_rate_measure(root=str(root))
        yield {"root": root, "entry": entry.pk, "gbps": rate.gbps}


@pytest.fixture
def stack(measured_root: dict[str, Any], tmp_path: Path,
          test_engine_image: str) -> Iterator[str]:  # noqa: F811
    env = {"APPLIANCE_ENGINE_IMAGE": test_engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
           "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.02,TEST_ENGINE_SHARDS=6",
           "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5",
           "APPLIANCE_MODEL_ROOTS": str(measured_root["root"])}
    with appliance_stack(tmp_path, env) as url:
        yield url


def test_a_store_entry_deploys_with_its_expected_load_and_the_card_gives_the_rate_reached(
        operator, measured_root: dict[str, Any], stack: str, page: Page) -> None:  # type: ignore[no-untyped-def]
    login(page, stack)
    page.goto(f"{stack}/deployments/new/?recipe=kimi-k2.6-baseline")
    page.fill("#id_name", "from-the-store")
    rate = f"{measured_root['gbps']:.2f} GB/s"
    page.select_option("#id_model_entry", str(measured_root["entry"]))
    estimate = page.locator("#estimate-model_path")
    expect(estimate).to_contain_text(f"Expected load: 0.13 GB of weights at {rate}")
    expect(estimate).to_contain_text("(ready)")
    page.fill("#id_gpu_ids", "0")
    page.fill("#id_tp_size", "1")
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    expect(page.locator("h1")).to_have_text("from-the-store")
    expect(page.locator("#preflight")).to_contain_text("load-time")
    expect(page.locator("#status")).to_have_text("ready", timeout=90_000)
    card = page.locator("#weights-rate")
    expect(card).to_contain_text(re.compile(
        r"read at [\d.]+ (?:[kMG]B|bytes)/s in [\d.]+ s: [\d.]+ % of the disk's measured "
        + re.escape(rate)))
    page.reload()  # the summary the server renders says the same
    expect(card).to_contain_text(f"of the disk's measured {rate}")
    page.goto(f"{stack}/models/")
    expect(page.locator(f'#read-rates tr[data-root="{measured_root["root"]}"]')).to_contain_text(
        rate)


def _off_the_loop(work: Any) -> None:
    """ORM writes from a thread of their own: Playwright's loop runs in this one."""
    import threading

    from django.db import connection

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def _download_at(entry_id: int, state: str, done: int, size: int) -> None:
    from web.store.models import ModelEntry

    ModelEntry.objects.filter(pk=entry_id).update(state=state, bytes_done=done,
                                                  size_bytes=size)


def test_a_deployment_waits_for_its_downloading_model_live_then_starts(
        operator, measured_root: dict[str, Any], stack: str, page: Page) -> None:  # type: ignore[no-untyped-def]
    entry, size = measured_root["entry"], 4 * 10**9
    _off_the_loop(lambda: _download_at(entry, "downloading", size // 4, size))
    login(page, stack)
    page.goto(f"{stack}/deployments/new/?recipe=kimi-k2.6-baseline")
    page.fill("#id_name", "waits-for-it")
    page.select_option("#id_model_entry", str(entry))
    expect(page.locator("#estimate-model_path")).to_contain_text("(downloading)")
    page.fill("#id_gpu_ids", "0")
    page.fill("#id_tp_size", "1")
    page.check("#id_confirm_warnings")
    page.click("#deploy")
    expect(page.locator("#preflight")).to_contain_text("model-downloading")
    waiting = page.locator("#model-download")
    expect(waiting).to_contain_text("Llama-128M is downloading (25 %)", timeout=20_000)
    expect(page.locator("#status")).to_have_text("queued")
    _off_the_loop(lambda: _download_at(entry, "verifying", size * 3 // 5, size))
    expect(waiting).to_contain_text("is verifying (60 %)", timeout=20_000)  # live, no reload
    _off_the_loop(lambda: _download_at(entry, "ready", size, size))
    expect(page.locator("#status")).to_have_text("ready", timeout=90_000)
    expect(waiting).to_be_hidden()
