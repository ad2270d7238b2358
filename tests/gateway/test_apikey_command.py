"""manage.py apikey create | list | revoke."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from web.gateway.models import ApiKey

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("apikey", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_it_creates_lists_and_revokes_a_key(operator) -> None:  # type: ignore[no-untyped-def]
    secret, note = run("create", "otto", "evals", "--rate-limit", "30")
    secret = secret.strip()
    key = ApiKey.objects.get()
    assert secret.startswith(f"sk-sd-{key.prefix}") and "shown only now" in note
    listing, _ = run("list")
    assert f"sk-sd-{key.prefix}" in listing and "30/min" in listing
    assert secret not in listing
    revoked, _ = run("revoke", f"sk-sd-{key.prefix}")
    assert "revoked" in revoked
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_it_says_what_is_wrong(operator, viewer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CommandError, match="rate_limit_per_minute"):
        run("create", "otto", "k", "--rate-limit", "0")
    with pytest.raises(CommandError, match="not an operator"):
        run("create", "vera", "k")
    with pytest.raises(CommandError, match="no unrevoked key"):
        run("revoke", "sk-sd-00000000")
    assert not ApiKey.objects.exists()
