"""Adding a model from the (local) hub: progress, verification, resume, refusals, cancel."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from appliance.store.scan import MARKER, read_marker
from tests.store.hubserver import HubServer
from web.store import services
from web.store.models import FileState, ModelEntry, ModelFile, ModelState

pytestmark = pytest.mark.django_db(transaction=True)
REPO = "acme/tiny-llama"
SHARD = "model-00001-of-00002.safetensors"


def _run(entry: ModelEntry, job: str = "job-1", attempt: int = 0) -> services.JobOutcome:
    return services.model_download_run(entry_id=entry.pk, job_id=job, attempt=attempt)


def _run_in_thread(entry: ModelEntry) -> threading.Thread:
    def run() -> None:
        try:
            _run(entry)
        finally:
            connection.close()  # the thread's own connection, or the test database stays busy

    job = threading.Thread(target=run)
    job.start()
    return job


def _request(**kwargs) -> ModelEntry:  # type: ignore[no-untyped-def]
    return services.model_download_request(repo_id=REPO, revision="main", **kwargs)


def test_it_downloads_every_file_and_is_ready_only_once_verified(store_root: Path, hub: HubServer) -> None:
    entry = _request()
    assert entry.state == ModelState.DOWNLOADING and not entry.is_usable
    assert _run(entry).state == ModelState.READY
    entry.refresh_from_db()
    repo = hub.state.repos[REPO]
    assert entry.is_usable and entry.verified_at is not None
    assert entry.commit == repo.commit and entry.size_bytes == sum(len(b) for b in repo.files.values())
    assert entry.bytes_done == entry.size_bytes and entry.file_count == 4
    assert entry.config["model_type"] == "llama" and entry.config["num_hidden_layers"] == 2
    assert entry.kind == "target" and entry.engine_path == f"/models/{REPO}"
    folder = store_root / REPO
    for path, data in repo.files.items():
        assert (folder / path).read_bytes() == data
    files = {f.path: f for f in ModelFile.objects.filter(entry=entry)}
    assert files[SHARD].sha256_expected == hashlib.sha256(repo.files[SHARD]).hexdigest()
    assert files[SHARD].sha256_actual == files[SHARD].sha256_expected
    assert files["config.json"].sha256_expected == ""  # a small git file: size only
    assert {f.state for f in files.values()} == {FileState.READY}
    assert read_marker(folder)["state"] == "ready"
    assert not list(folder.rglob("*.incomplete"))


def test_its_progress_shows_bytes_per_file_and_a_rate_while_it_downloads(store_root: Path, hub: HubServer) -> None:
    hub.state.rate = 150_000  # two 256 KiB shards side by side: about 1.7 s
    entry = _request()
    seen: list[tuple[int, int, float]] = []
    job = _run_in_thread(entry)
    while job.is_alive():
        row = ModelEntry.objects.get(pk=entry.pk)
        shard = ModelFile.objects.filter(entry=entry, path=SHARD).first()
        if shard is not None:
            seen.append((row.bytes_done, shard.bytes_done, row.rate_bps))
        time.sleep(0.05)
    job.join()
    size = ModelEntry.objects.get(pk=entry.pk).size_bytes
    middle = [s for s in seen if 0 < s[0] < size]
    assert len(middle) >= 5, seen
    assert [s[0] for s in middle] == sorted(s[0] for s in middle)  # never goes back
    assert any(0 < s[1] < len(hub.state.repos[REPO].files[SHARD]) for s in middle)
    assert any(100_000 < s[2] < 1_000_000 for s in middle)  # near 2 x 150 kB/s


def test_it_resumes_a_file_from_its_partial_bytes_with_a_ranged_get(store_root: Path, hub: HubServer) -> None:
    data = hub.state.repos[REPO].files[SHARD]
    folder = store_root / REPO
    folder.mkdir(parents=True)
    (folder / (SHARD + ".incomplete")).write_bytes(data[:100_000])  # a killed job's part
    entry = _request()
    assert _run(entry).state == ModelState.READY
    assert hub.state.ranges(SHARD) == ["bytes=100000-"]
    assert (folder / SHARD).read_bytes() == data


def test_a_network_fault_mid_file_is_resumed_where_it_stopped(store_root: Path, hub: HubServer) -> None:
    hub.state.drop_after = 50_000
    entry = _request()
    assert _run(entry).state == ModelState.READY
    resumed = [r for path in hub.state.repos[REPO].files for r in hub.state.ranges(path) if r]
    # From the bytes it had written (whole 16 KiB chunks of the ~53 kB sent), not from zero.
    assert len(resumed) == 1 and 0 < int(resumed[0].split("=")[1].rstrip("-")) <= 53_248


def test_a_checksum_mismatch_fails_the_entry_naming_the_file(store_root: Path, hub: HubServer) -> None:
    hub.state.corrupt = {SHARD}
    entry = _request()
    assert _run(entry).state == ModelState.FAILED
    entry.refresh_from_db()
    assert not entry.is_usable and SHARD in entry.error and "sha256" in entry.error
    bad = ModelFile.objects.get(entry=entry, path=SHARD)
    assert bad.state == FileState.FAILED and bad.sha256_actual != bad.sha256_expected
    assert not (store_root / REPO / SHARD).exists()  # removed: the next try fetches it anew
    hub.state.corrupt = set()
    again = _request()
    assert again.pk == entry.pk and _run(again, "job-2").state == ModelState.READY


def test_a_small_git_file_is_checked_against_its_blob_id(store_root: Path, hub: HubServer) -> None:
    hub.state.corrupt = {"config.json"}  # same size, one byte flipped; no LFS sha256 for it
    entry = _request()
    assert _run(entry).state == ModelState.FAILED
    error = ModelEntry.objects.get(pk=entry.pk).error
    assert "config.json: git blob id" in error and not entry.is_usable
    assert ModelFile.objects.get(entry=entry, path="config.json").state == FileState.FAILED


def test_a_cancel_stops_the_download_and_leaves_no_half_file(store_root: Path, hub: HubServer) -> None:
    hub.state.rate = 100_000
    entry = _request()
    job = _run_in_thread(entry)
    while not ModelFile.objects.filter(entry=entry, path=SHARD, bytes_done__gt=0).exists():
        time.sleep(0.02)
    services.model_download_cancel(entry_id=entry.pk)
    job.join(timeout=30)
    entry.refresh_from_db()
    assert not job.is_alive() and entry.state == ModelState.CANCELLED
    assert not list((store_root / REPO).rglob("*.incomplete"))
    assert entry.bytes_done < entry.size_bytes


def test_a_cancel_of_an_entry_no_job_holds_is_at_once(store_root: Path) -> None:
    entry = _request()
    assert services.model_download_cancel(entry_id=entry.pk).state == ModelState.CANCELLED


def test_a_second_job_waits_for_the_first_ones_lease(store_root: Path, hub: HubServer) -> None:
    entry = _request()
    ModelEntry.objects.filter(pk=entry.pk).update(lease_owner="other",
                                                  lease_until="2999-01-01T00:00:00Z")
    outcome = _run(entry, "job-2")
    assert outcome.state == "busy" and outcome.retry_in and outcome.retry_in > 0
    assert not [r for r in hub.state.requests if "/resolve/" in r.path]


def test_a_hub_that_takes_no_connection_fails_the_add_in_seconds_naming_it(store_root: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.HF_ENDPOINT = "http://127.0.0.1:9"  # nothing listens there
    entry = _request()
    started = time.monotonic()
    assert _run(entry).state == ModelState.FAILED
    assert time.monotonic() - started < 5
    error = ModelEntry.objects.get(pk=entry.pk).error
    assert error.startswith("cannot reach the hub at http://127.0.0.1:9: ")
    assert "Connection refused" in error and "3 tries" in error
    assert "APPLIANCE_HF_ENDPOINT" in error


def test_a_name_that_does_not_resolve_is_said_so(store_root: Path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.HF_ENDPOINT = "http://no-such-hub.invalid"
    entry = _request()
    assert _run(entry).state == ModelState.FAILED
    error = ModelEntry.objects.get(pk=entry.pk).error
    assert "cannot reach the hub at http://no-such-hub.invalid" in error
    assert "not known" in error or "resolution" in error


def test_a_hub_that_goes_away_after_the_first_try_is_tried_again_then_marked_partial(store_root: Path, hub: HubServer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.STORE_RETRIES = 2
    entry = _request()
    settings.HF_ENDPOINT = "http://127.0.0.1:9"  # it answered the first job, not this one
    first = _run(entry, attempt=1)
    assert first.state == "retry" and ModelEntry.objects.get(pk=entry.pk).state == "downloading"
    assert _run(entry, attempt=2).state == ModelState.PARTIAL
    assert "gave up after 2 tries" in ModelEntry.objects.get(pk=entry.pk).error


def test_an_unknown_repo_fails_with_what_to_do(store_root: Path) -> None:
    entry = services.model_download_request(repo_id="acme/nope", revision="main")
    assert _run(entry).state == ModelState.FAILED
    assert "no such repository" in ModelEntry.objects.get(pk=entry.pk).error


def test_an_unknown_revision_fails_with_what_to_do(store_root: Path) -> None:
    entry = services.model_download_request(repo_id=REPO, revision="v9")
    assert _run(entry).state == ModelState.FAILED
    assert "no such revision" in ModelEntry.objects.get(pk=entry.pk).error


def test_bad_input_names_the_field_and_stores_nothing(store_root: Path) -> None:
    with pytest.raises(services.StoreInputError) as bad:
        services.model_download_request(repo_id="../etc", revision="main", root="/elsewhere",
                                        relative_path="a/../../b")
    assert set(bad.value.errors) == {"repo_id", "root", "path"}
    assert not ModelEntry.objects.exists()


def test_a_folder_holding_another_model_is_refused(store_root: Path, hub: HubServer) -> None:
    entry = _request()
    _run(entry)
    with pytest.raises(services.StoreInputError) as bad:
        _request()
    assert "already holds" in bad.value.errors["path"]


def test_another_revision_into_a_failed_entrys_folder_is_refused(store_root: Path, hub: HubServer) -> None:
    hub.state.corrupt = {SHARD}
    entry = _request()
    _run(entry)
    with pytest.raises(services.StoreInputError) as bad:
        services.model_download_request(repo_id=REPO, revision="v2")
    assert "acme/tiny-llama@main (failed): choose another folder" in bad.value.errors["path"]
    assert ModelEntry.objects.get(pk=entry.pk).state == ModelState.FAILED


def test_the_marker_names_the_repo_and_commit_for_a_scan(store_root: Path, hub: HubServer) -> None:
    _run(_request())
    marker = read_marker(store_root / REPO)
    assert marker["repo_id"] == REPO and marker["commit"] == hub.state.repos[REPO].commit
    assert (store_root / REPO / MARKER).is_file()


def test_a_worker_start_queues_a_job_for_each_download_left_running(store_root: Path, live_channel) -> None:  # type: ignore[no-untyped-def]
    live_channel.delete("models")
    running = _request()
    done = services.model_download_request(repo_id="acme/other")
    ModelEntry.objects.filter(pk=done.pk).update(state=ModelState.READY)
    ModelEntry.objects.create(root=str(store_root), relative_path="local", state="ready")
    live_channel.delete("models")  # the requests' own jobs
    assert services.model_downloads_resume() == [running.pk]
    queued = [json.loads(m) for m in live_channel.lrange("models", 0, -1)]
    assert [m["headers"]["argsrepr"] for m in queued] == [f"[{running.pk}]"]


def test_a_folder_outside_the_model_roots_is_refused_with_the_roots_named(store_root: Path) -> None:
    with pytest.raises(services.StoreInputError) as bad:
        services.model_download_request(repo_id=REPO, relative_path="/etc")
    message = bad.value.errors["path"]
    assert message.startswith("/etc is outside the model roots") and str(store_root) in message
    for escape in ("../etc", "org/../../etc"):
        with pytest.raises(services.StoreInputError) as bad:
            services.model_download_request(repo_id=REPO, relative_path=escape)
        assert "no '..'" in bad.value.errors["path"]
    assert not ModelEntry.objects.exists()


def test_a_folder_a_symlink_leads_out_of_the_root_is_refused(store_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (store_root / "org").symlink_to(outside)
    with pytest.raises(services.StoreInputError) as bad:
        services.model_download_request(repo_id=REPO, relative_path="org/tiny")
    assert f"resolves to {os.path.realpath(outside)}/tiny, outside the model roots" in bad.value.errors["path"]
    assert not ModelEntry.objects.exists()


def test_a_full_path_inside_the_root_is_the_folder_below_it(store_root: Path) -> None:
    entry = services.model_download_request(repo_id=REPO, relative_path=f"{store_root}/acme/x")
    assert entry.relative_path == "acme/x" and entry.root == str(store_root)
