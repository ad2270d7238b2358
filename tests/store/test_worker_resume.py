"""A real Celery worker downloads a model; killed with SIGKILL mid-file, the next worker
resumes that file where the first one stopped (a ranged GET), never from zero, and scans
the roots at its start (a folder copied in meanwhile is listed)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.models import write_model
from tests.servers import celery_worker
from tests.store.conftest import TOKEN
from tests.store.hubserver import HubServer, small_repo
from web.store import services
from web.store.models import ModelEntry, ModelFile, ModelState

pytestmark = pytest.mark.django_db(transaction=True)
SHARD = "model-00001-of-00002.safetensors"


def _until(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _worker_env(root: Path, hub: HubServer) -> dict[str, str]:
    return {"APPLIANCE_MODEL_ROOTS": str(root), "APPLIANCE_HF_ENDPOINT": hub.url,
            "APPLIANCE_ENGINE_SECRETS_DIR": settings.ENGINE_SECRETS_DIR,
            "APPLIANCE_STORE_LEASE_S": "2", "APPLIANCE_STORE_PROGRESS_MS": "50",
            "APPLIANCE_STORE_CHUNK_BYTES": "16384"}


def test_a_download_resumes_after_its_worker_is_killed_mid_file(store_root: Path, tmp_path: Path) -> None:
    redis.Redis.from_url(settings.REDIS_URL).delete("models")  # no other test's job
    repo = small_repo(shard_bytes=1024 * 1024)
    data = repo.files[SHARD]
    with HubServer(repo) as hub:
        hub.state.token, hub.state.rate = TOKEN, 300_000  # about 3.5 s per shard
        env = _worker_env(store_root, hub)
        part = store_root / repo.repo_id / (SHARD + ".incomplete")
        with celery_worker(tmp_path / "worker-1.log", **env) as first:
            entry = services.model_download_request(repo_id=repo.repo_id)
            _until(lambda: part.is_file() and 200_000 < part.stat().st_size < len(data) // 2,
                   30, "the first worker to be mid-file")
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        at_kill = part.stat().st_size
        assert 0 < at_kill < len(data)
        assert ModelEntry.objects.get(pk=entry.pk).state == ModelState.DOWNLOADING
        write_model(store_root / "Copied-By-Hand")  # while no worker ran
        with celery_worker(tmp_path / "worker-2.log", **env):
            _until(lambda: ModelEntry.objects.get(pk=entry.pk).state in
                   (ModelState.READY, ModelState.FAILED, ModelState.PARTIAL), 60,
                   "the second worker to finish")
            _until(lambda: ModelEntry.objects.filter(relative_path="Copied-By-Hand").exists(),
                   30, "the start's scan")
        entry.refresh_from_db()
        assert entry.state == ModelState.READY, entry.error
        assert ModelEntry.objects.get(relative_path="Copied-By-Hand").state == ModelState.READY
        assert (store_root / repo.repo_id / SHARD).read_bytes() == data
        ranges = hub.state.ranges(SHARD)
        assert ranges[0] is None and ranges[1] == f"bytes={at_kill}-", ranges
        assert ModelFile.objects.get(entry=entry, path=SHARD).sha256_actual == \
            ModelFile.objects.get(entry=entry, path=SHARD).sha256_expected
        logs = (tmp_path / "worker-1.log").read_text() + (tmp_path / "worker-2.log").read_text()
        assert TOKEN not in logs
        assert all(r.authorized for r in hub.state.requests)  # the token went to the hub
