"""The store's REST API: list, detail with files, add, cancel, scan; roles; bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tests.models import write_model
from tests.store.hubserver import HubServer
from web.store import services
from web.store.models import ModelEntry, ModelState

pytestmark = pytest.mark.django_db(transaction=True)


def _client(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_an_operator_adds_a_model_and_reads_its_files_once_downloaded(operator, store_root: Path, hub: HubServer) -> None:  # type: ignore[no-untyped-def]
    client = _client(operator)
    answer = client.post("/api/models/", {"repo_id": "acme/tiny-llama", "revision": "main"},
                         format="json")
    assert answer.status_code == 202, answer.content
    entry_id = answer.json()["id"]
    assert answer.json()["state"] == "downloading" and answer.json()["usable"] is False
    services.model_download_run(entry_id=entry_id, job_id="job-1")
    detail = client.get(f"/api/models/{entry_id}/").json()
    assert detail["state"] == "ready" and detail["usable"] is True
    assert detail["engine_path"] == "/models/acme/tiny-llama"
    assert {f["path"] for f in detail["files"]} == set(hub.state.repos["acme/tiny-llama"].files)
    assert all(f["state"] == "ready" for f in detail["files"])
    listed = client.get("/api/models/").json()["results"]
    assert [e["id"] for e in listed] == [entry_id] and "files" not in listed[0]


def test_bad_input_is_a_400_naming_each_field(operator, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    answer = _client(operator).post("/api/models/", {"repo_id": "a b", "root": "/etc",
                                                     "path": "../up"}, format="json")
    assert answer.status_code == 400
    assert set(answer.json()) >= {"repo_id", "root", "path"}
    assert not ModelEntry.objects.exists()


def test_a_missing_repo_id_is_a_400(operator, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    answer = _client(operator).post("/api/models/", {}, format="json")
    assert answer.status_code == 400 and "repo_id" in answer.json()


def test_an_unknown_state_filter_is_a_400(viewer) -> None:  # type: ignore[no-untyped-def]
    answer = _client(viewer).get("/api/models/?state=finished")
    assert answer.status_code == 400 and "state" in answer.json()


def test_a_viewer_reads_but_may_not_add_cancel_or_scan(viewer, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    client = _client(viewer)
    assert client.get("/api/models/").status_code == 200
    assert client.post("/api/models/", {"repo_id": "acme/x"}, format="json").status_code == 403
    assert client.post("/api/models/scan/").status_code == 403
    entry = services.model_download_request(repo_id="acme/tiny-llama")
    assert client.post(f"/api/models/{entry.pk}/cancel/").status_code == 403


def test_an_operator_cancels_a_download(operator, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    entry = services.model_download_request(repo_id="acme/tiny-llama")
    answer = _client(operator).post(f"/api/models/{entry.pk}/cancel/")
    assert answer.status_code == 202 and answer.json()["state"] == ModelState.CANCELLED


def test_a_scan_lists_a_folder_copied_by_hand(operator, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    write_model(store_root / "Local-7B", {"model_type": "qwen3", "num_hidden_layers": 4})
    answer = _client(operator).post("/api/models/scan/")
    assert answer.status_code == 200
    (found,) = answer.json()
    assert found["relative_path"] == "Local-7B" and found["source"] == "local"
    assert found["state"] == "ready" and found["config"]["num_hidden_layers"] == 4
