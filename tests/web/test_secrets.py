"""No built-in secret in production: generated once and kept; a known one is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from web import initsecrets
from web.security import require_production_secrets, secret_problems

ROOT = Path(__file__).resolve().parents[2]


def test_secrets_are_made_once_and_never_overwritten(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("APPLIANCE_SECRET_KEY", raising=False)
    monkeypatch.delenv("APPLIANCE_DB_PASSWORD", raising=False)
    assert initsecrets.ensure(tmp_path) == ["secret_key", "db_password", "admin_password"]
    key = (tmp_path / "secret_key").read_text()
    assert len(key.strip()) >= 64
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert initsecrets.ensure(tmp_path) == []
    assert (tmp_path / "secret_key").read_text() == key


def test_a_value_from_env_is_used_for_the_first_start(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("APPLIANCE_DB_PASSWORD", "brought-my-own-password-of-length")
    initsecrets.ensure(tmp_path)
    assert (tmp_path / "db_password").read_text().strip() == "brought-my-own-password-of-length"


@pytest.mark.parametrize("key", ["insecure-development-key-change-me", "change-me-in-production",
                                 "short"])
def test_the_server_refuses_a_known_or_short_secret_key(key: str) -> None:
    with override_settings(SECRET_KEY=key, DEBUG=False), \
            pytest.raises(ImproperlyConfigured, match="APPLIANCE_SECRET_KEY"):
        require_production_secrets()


def test_debug_allows_the_development_key() -> None:
    with override_settings(SECRET_KEY="insecure-development-key-change-me", DEBUG=True):
        require_production_secrets()
        assert secret_problems()  # still named, just not fatal


def test_uvicorn_will_not_serve_with_the_development_key() -> None:
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "web.settings"}
    done = subprocess.run([sys.executable, "-c", "import web.asgi"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "refusing to start with known secrets" in done.stderr
