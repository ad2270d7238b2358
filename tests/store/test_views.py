"""The store's panel pages: the list with the add form, an entry's page, cancel, scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import write_model
from web.store import services
from web.store.models import ModelEntry, ModelState

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_list_shows_each_model_with_its_state_and_architecture(client, viewer, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    write_model(store_root / "Tiny", {"model_type": "deepseek_v3", "num_hidden_layers": 61,
                                      "n_routed_experts": 384, "kv_lora_rank": 512})
    services.model_store_scan()
    client.force_login(viewer)
    page = client.get("/models/").content.decode()
    assert "Tiny" in page and "ready" in page and "384 experts" in page and "MLA" in page
    assert 'id="add-model"' not in page  # a viewer gets no add form


def test_the_add_form_shows_field_errors_and_keeps_the_input(client, operator, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    answer = client.post("/models/", {"repo_id": "not a repo", "revision": "main"})
    assert answer.status_code == 400
    page = answer.content.decode()
    assert "repo_id: must be a hub repository id" in page and 'value="not a repo"' in page
    assert not ModelEntry.objects.exists()


def test_the_add_form_makes_an_entry_and_opens_its_page(client, operator, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    answer = client.post("/models/", {"repo_id": "acme/tiny-llama", "revision": "main"})
    entry = ModelEntry.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/models/{entry.pk}/"
    page = client.get(answer["Location"]).content.decode()
    assert "/models/acme/tiny-llama" in page and "not usable until verified" in page
    assert 'id="cancel-download"' in page


def test_cancel_from_the_page(client, operator, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    entry = services.model_download_request(repo_id="acme/tiny-llama")
    client.post(f"/models/{entry.pk}/cancel/")
    assert ModelEntry.objects.get(pk=entry.pk).state == ModelState.CANCELLED


def test_a_viewer_may_not_add_or_scan(client, viewer, store_root: Path) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    assert client.post("/models/", {"repo_id": "acme/x"}).status_code == 403
    assert client.post("/models/scan/").status_code == 403
