"""Secrets travel into an engine container as files, never as its configuration: the
agent's archive (appliance.runtime.secrets) and the image's entrypoint that exports them."""

from __future__ import annotations

import importlib.util
import io
import os
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from appliance.runtime.secrets import CONTAINER_DIR, secrets_archive

ROOT = Path(__file__).resolve().parents[3]
PLANTED = "hf_" + "PlantedSecretValue0123456789"


def _entrypoint() -> ModuleType:
    path = ROOT / "docker/engine/runtime/entrypoint.py"
    spec = importlib.util.spec_from_file_location("engine_entrypoint", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_archive_holds_one_owner_only_file_per_secret_under_run() -> None:
    with tarfile.open(fileobj=io.BytesIO(secrets_archive({"HF_TOKEN": PLANTED}))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        token = members[f"{CONTAINER_DIR}/HF_TOKEN"]
        assert token.mode == 0o400 and token.uid == 0
        assert members[CONTAINER_DIR].mode == 0o700
        handle = tar.extractfile(token)
        assert handle is not None and handle.read().decode() == PLANTED
    assert secrets_archive({}) == b""


def test_the_entrypoint_exports_each_file_by_name_and_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "HF_TOKEN").write_text(PLANTED)
    (tmp_path / "lower-case").write_text("ignored")
    for name in ("HF_TOKEN", "APPLIANCE_SECRET_NAMES", "lower-case"):
        monkeypatch.delenv(name, raising=False)
    assert _entrypoint().load_secrets(str(tmp_path)) == ["HF_TOKEN"]
    assert os.environ["HF_TOKEN"] == PLANTED
    assert os.environ["APPLIANCE_SECRET_NAMES"] == "HF_TOKEN"
    assert not (tmp_path / "HF_TOKEN").exists()
    assert _entrypoint().load_secrets(str(tmp_path / "absent")) == []
