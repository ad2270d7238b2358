"""The settings' typed reads of the environment (a typo is an error naming the variable,
never a silent default) and the database's settings from APPLIANCE_DATABASE_URL: what
web/settings.py is configured by."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    """A string from NAME, or from the file named by NAME_FILE (for secrets).

    A non-empty NAME wins over NAME_FILE, so a value set in .env overrides a generated one.
    """
    value = os.environ.get(name, "")
    file_path = os.environ.get(f"{name}_FILE")
    if not value and file_path:
        return Path(file_path).read_text().strip()
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]



def database_settings(url: str, base_dir: Path) -> dict[str, object]:
    """postgres://user:password@host:port/name, or SQLite when unset."""
    if not url:
        (base_dir / "var").mkdir(exist_ok=True)
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": base_dir / "var" / "db.sqlite3"}
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise ValueError(
            f"APPLIANCE_DATABASE_URL scheme {parsed.scheme!r} is not supported: use postgres://"
        )
    # The password may come apart from the URL (a generated one, in a file).
    password = env_str("APPLIANCE_DATABASE_PASSWORD", "") or unquote(parsed.password or "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.path.lstrip("/"),
        "USER": unquote(parsed.username or ""),
        "PASSWORD": password,
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        # Under ASGI each in-flight request runs its ORM work on its own thread, with its
        # own connection: unbounded, they ran PostgreSQL out of connections. The pool
        # bounds them per process (a request waits for a free one instead); it needs
        # CONN_MAX_AGE 0, and close() hands a connection back to it.
        "CONN_MAX_AGE": 0,
        # With the pool: an idle pooled connection is checked before use, so one that a
        # database restart broke is replaced rather than failing a request.
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {
            **_database_pool(),
            # Parameters bound by PostgreSQL rather than quoted into the SQL by psycopg, so
            # psycopg can prepare a statement a pooled connection has run this many times
            # (Django's default: client-side binding, nothing prepared). Measured
            # (docs/performance.md, Status API): PostgreSQL's CPU for the
            # ORM's reads fell by 60-75 % (parse and plan once per connection); the status
            # reads' statement is prepared the same way.
            "server_side_binding": True,
            "prepare_threshold": _prepare_threshold(),
        },
    }


def _prepare_threshold() -> int | None:
    """Negative: nothing is prepared (a transaction-mode pooler in front of PostgreSQL,
    e.g. PgBouncer before 1.21, cannot keep prepared statements; server-side binding
    itself works through one)."""
    threshold = env_int("APPLIANCE_DB_PREPARE_THRESHOLD", 5)
    return None if threshold < 0 else threshold


def _database_pool() -> dict[str, object]:
    """psycopg's pool (Django's OPTIONS["pool"]); APPLIANCE_DB_POOL_MAX_SIZE=0 turns it off.

    The size is per process (panel, worker, agent; the agent keeps one per engine it
    follows): their sum must stay below the server's max_connections (100 by default).
    """
    max_size = env_int("APPLIANCE_DB_POOL_MAX_SIZE", 20)
    if max_size <= 0:
        return {}
    return {"pool": {
        "min_size": min(max_size, env_int("APPLIANCE_DB_POOL_MIN_SIZE", 2)),
        "max_size": max_size,
        # How long a request waits for a free connection before it fails.
        "timeout": float(env_int("APPLIANCE_DB_POOL_TIMEOUT_S", 10)),
        # An idle connection above min_size is closed after this long (one at a time).
        "max_idle": float(env_int("APPLIANCE_DB_POOL_MAX_IDLE_S", 60)),
    }}
