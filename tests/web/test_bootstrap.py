"""The first admin: its generated password is kept in the secrets folder and printed at each
start until the admin first logs in; one from the environment is never printed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from web import initsecrets

pytestmark = pytest.mark.django_db


def _log_in(password: str) -> None:
    """Through the login form, as a person does (it records the login)."""
    answer = Client().post("/login/", {"username": "admin", "password": password}, follow=True)
    assert answer.status_code == 200 and "Log out" in answer.content.decode()


def _start() -> str:
    """What a start of `web` prints (the entrypoint runs bootstrap each time)."""
    out = io.StringIO()
    call_command("bootstrap", stdout=out)
    return out.getvalue()


@pytest.fixture
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("APPLIANCE_ADMIN_PASSWORD", raising=False)
    monkeypatch.setenv("APPLIANCE_ADMIN_USER", "admin")
    assert "admin_password" in initsecrets.ensure(tmp_path)  # compose's init
    monkeypatch.setenv("APPLIANCE_ADMIN_PASSWORD_FILE", str(tmp_path / "admin_password"))
    get_user_model().objects.filter(is_superuser=True).delete()
    return tmp_path


def test_the_kept_password_is_printed_at_every_start_until_the_first_login(
        secrets_dir: Path) -> None:
    kept = (secrets_dir / "admin_password").read_text().strip()
    assert (secrets_dir / "admin_password").stat().st_mode & 0o777 == 0o600
    first, second = _start(), _start()  # a recreated web container starts again
    line = (f"Admin account 'admin' password: '{kept}' (printed at each start until its "
            "first login). Reset it: docker compose exec web python3 manage.py "
            "changepassword admin")
    assert line in first and line in second
    assert "Created admin account 'admin'." in first and "Created" not in second
    _log_in(kept)
    assert kept not in _start()


def test_a_changed_password_is_never_printed(secrets_dir: Path) -> None:
    _start()
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("chosen-by-the-admin-1")
    admin.save()
    assert "password" not in _start()


def test_a_password_from_the_environment_is_never_printed(
        secrets_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPLIANCE_ADMIN_PASSWORD", "set-in-dotenv-123")
    out = _start() + _start()
    assert "set-in-dotenv-123" not in out and "password" not in out
    _log_in("set-in-dotenv-123")


def test_without_a_secrets_folder_a_random_password_is_printed_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPLIANCE_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("APPLIANCE_ADMIN_PASSWORD_FILE", raising=False)
    get_user_model().objects.filter(is_superuser=True).delete()
    first = _start()
    assert "with password '" in first and "printed once" in first
    assert "password" not in _start()
