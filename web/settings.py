"""One settings module, configured by environment (typed helpers reject typos)."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

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


DEBUG = env_bool("APPLIANCE_DEBUG", False)
# A bare checkout runs with this; the web server refuses it unless DEBUG (web/security.py).
DEVELOPMENT_SECRET_KEY = "insecure-development-key-change-me"
SECRET_KEY = env_str("APPLIANCE_SECRET_KEY", DEVELOPMENT_SECRET_KEY)
ALLOWED_HOSTS = env_list("APPLIANCE_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("APPLIANCE_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "web.deployments",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "web.urls"
ASGI_APPLICATION = "web.asgi.application"
WSGI_APPLICATION = "web.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "web" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_DATABASE_URL = env_str("APPLIANCE_DATABASE_URL", "")


def _database(url: str) -> dict[str, object]:
    """postgres://user:password@host:port/name, or SQLite when unset."""
    if not url:
        (BASE_DIR / "var").mkdir(exist_ok=True)
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "var" / "db.sqlite3"}
    from urllib.parse import unquote, urlparse

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
        "OPTIONS": _database_pool(),
    }


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


DATABASES = {"default": _database(_DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("APPLIANCE_REDIS_URL", "redis://127.0.0.1:6379/0")
# redis-py's own default for a reply (5 s). A blocking read (the SSE live feed's XREAD,
# SSE_KEEPALIVE_S long) gets this much on top of its block time, never less.
REDIS_SOCKET_TIMEOUT_S = env_int("APPLIANCE_REDIS_SOCKET_TIMEOUT_S", 5)
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ALWAYS_EAGER = env_bool("APPLIANCE_CELERY_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "deployments:list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STATICFILES_DIRS = [BASE_DIR / "web" / "static"]
# Serve straight from the app and package folders when collectstatic has not run
# (a bare checkout, the test suite); the panel image collects them at build time.
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "web.api.exceptions.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Speculative-decoding appliance API",
    "DESCRIPTION": "Deploy SGLang with DFlash/DDTree speculative decoding and watch it live.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Engine containers
ENGINE_IMAGE = env_str("APPLIANCE_ENGINE_IMAGE", "")
ENGINE_NETWORK = env_str("APPLIANCE_ENGINE_NETWORK", "")
ENGINE_READY_TIMEOUT_S = env_int("APPLIANCE_ENGINE_READY_TIMEOUT_S", 3600)
ENGINE_STOP_TIMEOUT_S = env_int("APPLIANCE_ENGINE_STOP_TIMEOUT_S", 30)
# The engine agent: its id (stable per host; default agent@<hostname>) and its tick.
AGENT_ID = env_str("APPLIANCE_AGENT_ID", "")
AGENT_TICK_S = float(env_int("APPLIANCE_AGENT_TICK_MS", 1000)) / 1000
SSE_KEEPALIVE_S = env_int("APPLIANCE_SSE_KEEPALIVE_S", 15)
MODELS_DIR = env_str("APPLIANCE_MODELS_DIR", "")
# A folder of the site's own recipe files (<name>.yaml), offered beside the shipped ones.
RECIPES_DIR = env_str("APPLIANCE_RECIPES_DIR", "")
# Off only on hosts without an NVIDIA runtime (the test suite's machines).
ENGINE_GPU_REQUESTS = env_bool("APPLIANCE_ENGINE_GPU_REQUESTS", True)
# PEM bundle of a TLS-intercepting proxy for image builds' download steps (appliance.images).
BUILD_CA_BUNDLE = env_str("APPLIANCE_BUILD_CA_BUNDLE", "")
# How often a running image build looks for a stop request (milliseconds).
BUILD_CANCEL_POLL_MS = env_int("APPLIANCE_BUILD_CANCEL_POLL_MS", 500)
# The GPU self-check before the model load (a spec can opt out with self_check: false).
ENGINE_GPU_CHECK = env_bool("APPLIANCE_ENGINE_GPU_CHECK", True)
# Extra environment for every engine container (tests use it to pace the test engine).
ENGINE_EXTRA_ENV = dict(
    item.split("=", 1) for item in env_list("APPLIANCE_ENGINE_EXTRA_ENV") if "=" in item
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("APPLIANCE_LOG_LEVEL", "INFO")},
}
