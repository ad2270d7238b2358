"""A download that will not fit is refused before a byte is written, on a real small file
system (a tmpfs of 1 MiB mounted for the test)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store.conftest import TOKEN
from tests.store.hubserver import HubServer, small_repo
from web.store import services
from web.store.models import ModelEntry, ModelState

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the suite runs as root): {made.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_it_refuses_a_model_larger_than_the_free_space_with_a_clear_message(store_root: Path, small_fs: Path, settings) -> None:  # type: ignore[no-untyped-def]
    repo = small_repo(shard_bytes=1024 * 1024)  # two 1 MiB shards on a 1 MiB file system
    with HubServer(repo) as hub:
        hub.state.token = TOKEN
        settings.HF_ENDPOINT, settings.MODEL_ROOTS = hub.url, [str(small_fs)]
        entry = services.model_download_request(repo_id=repo.repo_id)
        outcome = services.model_download_run(entry_id=entry.pk, job_id="job-1")
    entry = ModelEntry.objects.get(pk=entry.pk)
    assert outcome.state == ModelState.FAILED and not entry.is_usable
    assert entry.error.startswith("not enough disk space: acme/tiny-llama@main needs 2.10 MB")
    assert f"{small_fs}" in entry.error and "free space there or add the model to another root" in entry.error
    assert not [r for r in hub.state.requests if "/resolve/" in r.path]  # not a byte fetched
    assert not list(small_fs.rglob("*"))


def test_a_model_that_fits_the_small_file_system_downloads(store_root: Path, small_fs: Path, settings) -> None:  # type: ignore[no-untyped-def]
    repo = small_repo(shard_bytes=128 * 1024)
    with HubServer(repo) as hub:
        hub.state.token = TOKEN
        settings.HF_ENDPOINT, settings.MODEL_ROOTS = hub.url, [str(small_fs)]
        entry = services.model_download_request(repo_id=repo.repo_id)
        assert services.model_download_run(entry_id=entry.pk, job_id="job-1").state == ModelState.READY


def _fill(fs: Path) -> Path:
    """Take every free byte of the file system (as another program might)."""
    filler = fs / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    return filler


def test_a_disk_that_fills_mid_download_marks_it_partial_and_a_retry_resumes(store_root: Path, small_fs: Path, settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    from django.db import connection

    repo = small_repo(shard_bytes=300 * 1024)
    shard = "model-00001-of-00002.safetensors"
    part = small_fs / repo.repo_id / (shard + ".incomplete")
    with HubServer(repo) as hub:
        hub.state.token, hub.state.rate = TOKEN, 200_000
        settings.HF_ENDPOINT, settings.MODEL_ROOTS = hub.url, [str(small_fs)]
        entry = services.model_download_request(repo_id=repo.repo_id)
        outcome: list[str] = []

        def job() -> None:
            try:
                outcome.append(services.model_download_run(entry_id=entry.pk, job_id="j1").state)
            finally:
                connection.close()

        thread = threading.Thread(target=job)
        thread.start()
        while not (part.is_file() and part.stat().st_size > 50_000):
            time.sleep(0.02)
        filler = _fill(small_fs)
        thread.join(timeout=30)
        stopped = ModelEntry.objects.get(pk=entry.pk)
        assert outcome == [ModelState.PARTIAL] and not stopped.is_usable
        assert "No space left on device" in stopped.error and str(small_fs) in stopped.error
        kept = part.stat().st_size
        assert kept > 50_000
        filler.unlink()
        hub.state.rate = None
        again = services.model_download_request(repo_id=repo.repo_id)
        assert services.model_download_run(entry_id=again.pk, job_id="j2").state == ModelState.READY
        assert hub.state.ranges(shard)[-1] == f"bytes={kept}-"
