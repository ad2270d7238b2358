"""The store's fixtures: a local hub serving a small repo, a model root, the secret store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store.hubserver import HubServer, small_repo

TOKEN = "hf_sEcReT0123456789tokenvalue"


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer(small_repo()) as server:
        yield server


@pytest.fixture
def store_root(tmp_path: Path, settings, hub: HubServer) -> Path:  # type: ignore[no-untyped-def]
    root = tmp_path / "models"
    root.mkdir()
    secrets = tmp_path / "engine-secrets"
    secrets.mkdir()
    (secrets / "HF_TOKEN").write_text(TOKEN + "\n")
    hub.state.token = TOKEN
    settings.MODEL_ROOTS = [str(root)]
    settings.HF_ENDPOINT = hub.url
    settings.ENGINE_SECRETS_DIR = str(secrets)
    settings.STORE_PROGRESS_MS = 20
    settings.STORE_RETRY_S = 0
    settings.STORE_CHUNK_BYTES = 16 * 1024
    return root
