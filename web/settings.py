"""One settings module, configured by environment (typed helpers reject typos)."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    """A string from NAME, or from the file named by NAME_FILE (for secrets)."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
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
SECRET_KEY = env_str("APPLIANCE_SECRET_KEY", "insecure-development-key-change-me")
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
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.path.lstrip("/"),
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        "CONN_MAX_AGE": 0,
    }


DATABASES = {"default": _database(_DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("APPLIANCE_REDIS_URL", "redis://127.0.0.1:6379/0")
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
