"""Django's database sessions, with a session key from a cookie checked for its form first:
Django makes keys of 32 lower-case letters and digits, and a cookie holding anything else (a
NUL through a quoted cookie's octal escape) would reach the database as it is."""

from __future__ import annotations

import re

from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore

_KEY = re.compile(r"[a-z0-9]{8,64}")


class SessionStore(DatabaseSessionStore):
    def _validate_session_key(self, key: str | None) -> bool:
        return bool(key) and _KEY.fullmatch(str(key)) is not None
