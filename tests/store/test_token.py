"""The HF token (engine secret store, HF_TOKEN) goes to the hub and nowhere else: not in a
log line, an entry's message, the marker file, an API answer or an SSE frame."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tests.store.conftest import TOKEN
from tests.store.hubserver import HubServer
from web.store import services
from web.store.api import ModelEntryDetailSerializer
from web.store.models import ModelEntry, ModelFile
from web.store.sse import frame

pytestmark = pytest.mark.django_db(transaction=True)


def _everything_said(entry_id: int, root: Path, operator) -> str:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(operator)
    entry = ModelEntry.objects.get(pk=entry_id)
    texts = [client.get("/api/models/").content.decode(),
             client.get(f"/api/models/{entry_id}/").content.decode(),
             frame(dict(ModelEntryDetailSerializer(entry).data), 1).decode(),
             entry.error, *(f.error for f in ModelFile.objects.filter(entry=entry))]
    texts += [p.read_text(errors="replace") for p in root.rglob(".appliance-model.json")]
    return "\n".join(texts)


def test_the_token_reaches_the_hub_and_appears_nowhere_else(store_root: Path, hub: HubServer, operator, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    hub.state.drop_after = 30_000  # a retry's warning names the URL: still no token
    entry = services.model_download_request(repo_id="acme/tiny-llama")
    assert services.model_download_run(entry_id=entry.pk, job_id="job-1").state == "ready"
    assert hub.state.requests and all(r.authorized for r in hub.state.requests)
    # huggingface_hub logs to stderr itself: the fault's lines are there to be read
    logged = caplog.text + capfd.readouterr().err
    assert "Trying to resume" in logged and "HTTP Request: GET" in logged
    assert TOKEN not in logged
    assert TOKEN not in _everything_said(entry.pk, store_root, operator)


def test_a_token_the_hub_refuses_fails_without_quoting_it(store_root: Path, hub: HubServer, operator, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    hub.state.token = "hf_anotherTokenTheHubWants"
    entry = services.model_download_request(repo_id="acme/tiny-llama")
    assert services.model_download_run(entry_id=entry.pk, job_id="job-1").state == "failed"
    error = ModelEntry.objects.get(pk=entry.pk).error
    assert "HF_TOKEN" in error  # says where the token comes from
    logged = caplog.text + capfd.readouterr().err
    assert "401" in logged and TOKEN not in logged
    assert TOKEN not in _everything_said(entry.pk, store_root, operator)


def test_without_a_token_in_the_store_it_sends_none(store_root: Path, hub: HubServer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.ENGINE_SECRETS_DIR = str(store_root / "no-such-store")
    hub.state.token = None
    entry = services.model_download_request(repo_id="acme/tiny-llama")
    assert services.model_download_run(entry_id=entry.pk, job_id="job-1").state == "ready"
    assert not any(r.authorized for r in hub.state.requests)
