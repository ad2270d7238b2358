"""Refuse to serve with a secret anyone can know.

The settings fall back to a development key so `manage.py` works in a bare checkout; a
server that others can reach must not sign sessions with it. The web process (web/asgi.py)
and the panel image's entrypoint call require_production_secrets() before serving.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

KNOWN_SECRET_KEYS = frozenset({
    "", "insecure-development-key-change-me", "change-me-in-production", "build",
})
KNOWN_DB_PASSWORDS = frozenset({"appliance", "postgres", "password", "change-me"})
MIN_SECRET_KEY_LENGTH = 32


def secret_problems() -> list[str]:
    """What is wrong with the secrets in use, each with its fix; empty when fine."""
    problems = []
    key = str(settings.SECRET_KEY)
    if key in KNOWN_SECRET_KEYS or len(key) < MIN_SECRET_KEY_LENGTH:
        problems.append(
            "APPLIANCE_SECRET_KEY is a built-in default or shorter than "
            f"{MIN_SECRET_KEY_LENGTH} characters: leave it unset under compose (a key is "
            "generated on first start and kept in the secrets volume) or set "
            "APPLIANCE_SECRET_KEY / APPLIANCE_SECRET_KEY_FILE to a long random value.")
    db = settings.DATABASES["default"]
    if "postgresql" in str(db["ENGINE"]) and str(db.get("PASSWORD") or "") in KNOWN_DB_PASSWORDS:
        problems.append(
            "the database password is a well-known default: leave APPLIANCE_DB_PASSWORD unset "
            "under compose (one is generated on first start) or set a long random one.")
    return problems


def require_production_secrets() -> None:
    """Raise ImproperlyConfigured naming each known default, unless DEBUG is on."""
    problems = secret_problems()
    if problems and not settings.DEBUG:
        raise ImproperlyConfigured(
            "refusing to start with known secrets (set APPLIANCE_DEBUG=1 only on a "
            "development machine): " + " ".join(problems))
