"""The model store's browser test, as a user: add a model from the (local) hub in the panel, watch
its progress, kill the worker mid-file and see the download resume where it stopped, see it
verified. The stack is real: the uvicorn panel and Celery workers as processes, Chromium."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from playwright.sync_api import Page, expect

from tests.conftest_docker import remove_engines
from tests.e2e.stack import login
from tests.servers import celery_worker, own_host_agent, panel_server
from tests.store.hubserver import HubServer, small_repo
from web.deployments.services.installation import instance_id

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
TOKEN = "hf_e2eTokenNeverShown0123456789"
SHARD = "model-00001-of-00002.safetensors"


def _cell(page: Page, path: str, column: int) -> str:
    return page.locator(f'#files tr[data-path="{path}"] td').nth(column).inner_text()


def _done(page: Page) -> int:
    text = _cell(page, SHARD, 2)
    return int(text) if text.isdigit() else 0


def _this_install() -> str:
    """The install's id (the engines this test may remove), read off Playwright's loop."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(instance_id()))
    reader.start()
    reader.join()
    return found[0]


def _env(tmp_path: Path, hub: HubServer, engine_image: str) -> dict[str, str]:
    root, secrets = tmp_path / "models", tmp_path / "engine-secrets"
    root.mkdir()
    secrets.mkdir()
    (secrets / "HF_TOKEN").write_text(TOKEN)
    return {"APPLIANCE_MODEL_ROOTS": str(root), "APPLIANCE_HF_ENDPOINT": hub.url,
            "APPLIANCE_ENGINE_SECRETS_DIR": str(secrets), "APPLIANCE_STORE_LEASE_S": "2",
            "APPLIANCE_STORE_PROGRESS_MS": "100", "APPLIANCE_STORE_CHUNK_BYTES": "16384",
            # The model, once verified, is deployed by its entry to the test engine.
            "APPLIANCE_ENGINE_IMAGE": engine_image, "APPLIANCE_ENGINE_GPU_REQUESTS": "0",
            "APPLIANCE_ENGINE_EXTRA_ENV": "TEST_ENGINE_PACE_S=0.02,TEST_ENGINE_SHARDS=4",
            "APPLIANCE_ENGINE_STOP_TIMEOUT_S": "5"}


def test_a_model_added_in_the_panel_resumes_after_a_worker_kill_and_is_verified(operator, page: Page, tmp_path: Path, test_engine_image: str) -> None:  # type: ignore[no-untyped-def]
    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # no stale jobs from other tests
    repo = small_repo(shard_bytes=1024 * 1024)
    with HubServer(repo) as hub, contextlib.ExitStack() as stack:
        hub.state.token, hub.state.rate = TOKEN, 120_000  # about 9 s per shard
        env = _env(tmp_path, hub, test_engine_image)
        url = stack.enter_context(panel_server(tmp_path / "web.log", **env))
        first = stack.enter_context(celery_worker(tmp_path / "worker-1.log", **env))
        login(page, url)
        page.click("nav >> text=Models")
        expect(page.locator("h1")).to_have_text("Models")
        page.fill("#repo-id", repo.repo_id)
        page.click("#add-submit")
        expect(page.locator("#entry-state")).to_have_text("downloading")
        expect(page.locator("#usable")).to_have_text("not usable until verified")
        # Progress, live: bytes of the shard, a rate and the time left.
        page.wait_for_function(
            """p => { const c = document.querySelector(`#files tr[data-path="${p}"] td.done`);
                      return c && +c.textContent > 200000; }""", arg=SHARD, timeout=30_000)
        expect(page.locator("#rate")).to_contain_text("/s")
        expect(page.locator("#eta")).to_contain_text("s left")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        before = _done(page)
        part = Path(env["APPLIANCE_MODEL_ROOTS"]) / repo.repo_id / (SHARD + ".incomplete")
        at_kill = part.stat().st_size
        assert 0 < before <= at_kill < len(repo.files[SHARD])
        # No job holds it once the dead one's lease ran out: no stale rate, says so.
        expect(page.locator("#rate")).to_have_text("waiting for a worker", timeout=15_000)
        expect(page.locator("#eta")).to_have_text("–")
        page.screenshot(path=str(tmp_path / "store-killed.png"))
        stack.enter_context(celery_worker(tmp_path / "worker-2.log", **env))
        listing = page.context.new_page()  # the list follows the resumed download too
        listing.goto(f"{url}/models/")
        expect(listing.locator("#models td.progress")).to_contain_text("/s", timeout=15_000)
        expect(listing.locator("#models td.progress")).to_contain_text(" of 2.1 MB")
        listing.close()
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while page.locator("#entry-state").inner_text() != "ready" and time.monotonic() < deadline:
            seen.append(_done(page))
            time.sleep(0.2)
        expect(page.locator("#entry-state")).to_have_text("ready")
        expect(page.locator("#usable")).to_have_text("usable by engines")
        assert seen and min(seen) >= before  # it went on, never back to zero
        assert hub.state.ranges(SHARD) == [None, f"bytes={at_kill}-"]
        # The ORM is off limits beside Playwright's loop: the API, as the logged-in user.
        (entry,) = page.request.get(f"{url}/api/models/").json()["results"]
        files = {f["path"]: f for f in page.request.get(
            f"{url}/api/models/{entry['id']}/").json()["files"]}
        sha = files[SHARD]["sha256_expected"]
        assert sha and files[SHARD]["sha256_actual"] == sha
        assert _cell(page, SHARD, 4) == sha and _cell(page, SHARD, 3) == "ready"
        expect(page.locator("#config")).to_contain_text('"num_hidden_layers":2')
        page.screenshot(path=str(tmp_path / "store-ready.png"))
        page.goto(f"{url}/models/")
        row = page.locator(f"#model-{entry['id']}")
        expect(row).to_contain_text("ready")
        expect(row).to_contain_text("llama, 2 layers")
        assert TOKEN not in page.content()
        # Deployed by store entry: the form offers it with its expected load, the test
        # engine starts on it.
        stack.enter_context(own_host_agent(tmp_path / "agent.log", url, tmp_path, **env))
        stack.callback(remove_engines, _this_install())
        page.goto(f"{url}/deployments/new/?recipe=kimi-k2.6-baseline")
        page.fill("#id_name", "from-the-hub")
        page.select_option("#id_model_entry", str(entry["id"]))
        expect(page.locator("#estimate-model_path")).to_contain_text("(ready)")
        page.fill("#id_gpu_ids", "0")
        page.fill("#id_tp_size", "1")
        page.check("#id_confirm_warnings")
        page.click("#deploy")
        expect(page.locator("h1")).to_have_text("from-the-hub")
        expect(page.locator("#status")).to_have_text("ready", timeout=90_000)
        page.goto(f"{url}/models/")
        expect(page.locator(f"#model-{entry['id']}")).to_contain_text("from-the-hub")
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert TOKEN not in logs
