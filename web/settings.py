"""One settings module, configured by environment (typed helpers reject typos)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from django.utils.text import slugify

from web.envsettings import database_settings, env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

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
    # Only for web/accounts' migration, which hashes any plain tokens left from it.
    "rest_framework.authtoken",
    "knox",
    "axes",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "web.deployments",
    "web.accounts",
    "web.benchmarks",
    "web.gateway",
    "web.store",
    "web.fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "web.limits.body_limit_middleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # WhiteNoise is sync-only. Under ASGI, Django runs every middleware outside the first
    # sync-only one in sync mode, all in the request's one thread; those inside it run in
    # async mode, which moves each of their hooks to a thread and back (the profile:
    # /healthz 6-7x a bare ASGI app, most of it those hops). Here, next to the view, it
    # leaves the whole list sync; static files pass the (lazy) session, CSRF and auth hooks.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Last, as its docs ask: turns a lockout into the page that says why and for how long.
    "axes.middleware.AxesMiddleware",
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
                # Every page says so when the engines are the simulator.
                "web.deployments.simulator.simulator_context",
            ],
        },
    },
]

_DATABASE_URL = env_str("APPLIANCE_DATABASE_URL", "")


DATABASES = {"default": database_settings(_DATABASE_URL, BASE_DIR)}
# A token GET of a deployment's detail or summary answered on the ASGI path before Django
# (web/api/asgi.py: the reads polled most), with Django's own headers; off: every request
# is Django's.
STATUS_READS_BEFORE_DJANGO = env_bool("APPLIANCE_STATUS_READS_BEFORE_DJANGO", True)
# The host API's ingest (a host's batches of events) answered on the ASGI path before Django
# (web/fleet/asgi.py), with the view's checks and answers; off: Django's view answers it.
HOST_INGEST_BEFORE_DJANGO = env_bool("APPLIANCE_HOST_INGEST_BEFORE_DJANGO", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("APPLIANCE_REDIS_URL", "redis://127.0.0.1:6379/0")
# redis-py's own default for a reply (5 s). A blocking read (the SSE live feed's XREAD,
# SSE_KEEPALIVE_S long) gets this much on top of its block time, never less.
REDIS_SOCKET_TIMEOUT_S = env_int("APPLIANCE_REDIS_SOCKET_TIMEOUT_S", 5)
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ALWAYS_EAGER = env_bool("APPLIANCE_CELERY_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

# Database sessions whose cookie must look like a session key (web/accounts/sessions.py).
SESSION_ENGINE = "web.accounts.sessions"

# Request bodies: a spec is a few KB; larger is refused with 413 (web/limits.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("APPLIANCE_MAX_BODY_BYTES", 1024 * 1024)
DATA_UPLOAD_MAX_NUMBER_FIELDS = 200
# The gateway (/v1, web/gateway): a prompt of a long context is far larger than a spec (Kimi
# K2.6's 262,144 tokens are about 1 MB of English, 3 MB of escaped CJK); larger is a 413.
GATEWAY_MAX_BODY_BYTES = env_int("APPLIANCE_GATEWAY_MAX_BODY_BYTES", 8 * 1024 * 1024)
# The most max_tokens (or max_completion_tokens) a request may ask of a deployment whose spec
# sets no engine.context_length (its own context length bounds it otherwise); more is a 400.
GATEWAY_MAX_TOKENS = env_int("APPLIANCE_GATEWAY_MAX_TOKENS", 262_144)
# Every request the gateway relays has a bounded wait (docs/gateway.md, "Bounded waits"):
# - the first byte of the answer's body (a stream's first event: after the engine's queue
#   and prefill) within FIRST_BYTE_TIMEOUT_S. Kimi K2.6 (1T parameters, 32B active) prefills
#   its whole 262,144-token context in about 30 s on 8 H200s (about 1e17 FLOPs, at 40 % of
#   their bf16 peak); 120 s leaves room for three such prefills queued ahead of it.
# - then no silence longer than IDLE_STREAM_TIMEOUT_S: a decode step is tens of ms; the
#   longest legitimate pause is a request the engine retracted (KV pool full) waiting to be
#   prefilled again, up to the whole context: 60 s is twice that prefill.
# - a whole (not streamed) answer comes at once, after its last token: past the first-byte
#   timeout it waits on, to WHOLE_ANSWER_TIMEOUT_S, while the engine's /health answers
#   (600 s: the OpenAI Python client's own default timeout; stream longer generations).
# A request not yet answered when its replica times out is sent once to another ready
# replica; a stream cut midway ends with an OpenAI-shaped error event and [DONE].
GATEWAY_FIRST_BYTE_TIMEOUT_S = env_int("APPLIANCE_GATEWAY_FIRST_BYTE_TIMEOUT_S", 120)
GATEWAY_IDLE_STREAM_TIMEOUT_S = env_int("APPLIANCE_GATEWAY_IDLE_STREAM_TIMEOUT_S", 60)
GATEWAY_WHOLE_ANSWER_TIMEOUT_S = env_int("APPLIANCE_GATEWAY_WHOLE_ANSWER_TIMEOUT_S", 600)
for _name, _value in (("FIRST_BYTE", GATEWAY_FIRST_BYTE_TIMEOUT_S),
                      ("IDLE_STREAM", GATEWAY_IDLE_STREAM_TIMEOUT_S),
                      ("WHOLE_ANSWER", GATEWAY_WHOLE_ANSWER_TIMEOUT_S)):
    if _value < 1:
        raise ValueError(f"APPLIANCE_GATEWAY_{_name}_TIMEOUT_S={_value} must be 1 or more "
                         "seconds (docs/gateway.md, \"Bounded waits\")")
# The gateway's base URL as the worker reaches it (compose: http://web:8000): a losslessness
# check "through the gateway" calls /v1 there, as a client would. Empty: that route is off.
GATEWAY_URL = env_str("APPLIANCE_GATEWAY_URL", "").rstrip("/")
# The panel's address as other machines reach it (e.g. https://panel.example:8000): what
# the Join tokens page prints for a GPU host's APPLIANCE_PANEL_URL. Empty: the address the
# admin's browser used, with a note when that is this machine's own loopback name.
PUBLIC_URL = env_str("APPLIANCE_PUBLIC_URL", "").rstrip("/")

# Login throttling (django-axes): after LOGIN_FAILURE_LIMIT wrong passwords for one username
# from one address, that pair is refused for LOGIN_COOLOFF_MINUTES. Counters live in Redis.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Django's ModelBackend, permissions in one query instead of two (web/accounts/backends.py).
    "web.accounts.backends.ModelBackend",
]
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "axes": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
             "KEY_PREFIX": "appliance-axes"},
}
AXES_HANDLER = "axes.handlers.cache.AxesCacheHandler"
AXES_CACHE = "axes"
AXES_FAILURE_LIMIT = env_int("APPLIANCE_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("APPLIANCE_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# The peer address only: a client-supplied X-Forwarded-For would pick its own counter.
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)

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
        # Hashed API tokens (django-rest-knox); `manage.py apitoken` makes and revokes them.
        "web.accounts.auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PARSER_CLASSES": [
        "web.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "web.api.pagination.BoundedPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "web.api.exceptions.exception_handler",
}
_TOKEN_TTL_DAYS = env_int("APPLIANCE_API_TOKEN_TTL_DAYS", 365)
REST_KNOX = {
    "AUTH_HEADER_PREFIX": "Token",
    "TOKEN_PREFIX": "sda_",
    "TOKEN_TTL": timedelta(days=_TOKEN_TTL_DAYS) if _TOKEN_TTL_DAYS > 0 else None,
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
# A rolling change waits this long for a drained replica's in-flight requests, then stops it.
ROLL_DRAIN_TIMEOUT_S = env_int("APPLIANCE_ROLL_DRAIN_TIMEOUT_S", 300)
# A running Tune whose task wrote no beat this long is taken as lost (its worker died): the
# panel loop's sweep (web/loop.py) sends it to the workers again, whose task restores the
# deployment.
TUNE_LOST_S = env_int("APPLIANCE_TUNE_LOST_S", 120)
# The engine agent: its id (stable per host; default agent@<hostname>) and its tick.
AGENT_ID = env_str("APPLIANCE_AGENT_ID", "")
AGENT_TICK_S = float(env_int("APPLIANCE_AGENT_TICK_MS", 1000)) / 1000
# The panel loop's tick (web/loop.py): the rolling changes' steps and the re-queue of dead
# builds each tick.
LOOP_TICK_S = float(env_int("APPLIANCE_LOOP_TICK_MS", 1000)) / 1000
# An agent whose heartbeat (every tick) is older than this is silent: its
# deployments show `unknown` with an alert until it reports again (deployments/silence.py).
AGENT_SILENT_S = env_int("APPLIANCE_AGENT_SILENT_S", 30)
SSE_KEEPALIVE_S = env_int("APPLIANCE_SSE_KEEPALIVE_S", 15)
MODELS_DIR = env_str("APPLIANCE_MODELS_DIR", "")
# Where the web process may read a model's config.json for pre-flight (the mount engines
# see as /models); a spec's path elsewhere is never opened by the web process.
MODEL_ROOTS = env_list("APPLIANCE_MODEL_ROOTS", "/models")
# The model store (web/store): downloads from this hub (huggingface_hub's own HF_ENDPOINT
# when APPLIANCE_HF_ENDPOINT is unset), with the engine secret store's HF_TOKEN; a download
# job holds its entry for STORE_LEASE_S past its last progress write (a killed worker's
# entry is resumed once that runs out), and a hub that does not answer is tried again
# STORE_RETRIES times, STORE_RETRY_S apart.
HF_ENDPOINT = env_str("APPLIANCE_HF_ENDPOINT",
                      os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
STORE_HF_TOKEN_NAME = "HF_TOKEN"
STORE_LEASE_S = env_int("APPLIANCE_STORE_LEASE_S", 30)
STORE_PROGRESS_MS = env_int("APPLIANCE_STORE_PROGRESS_MS", 500)
STORE_CHUNK_BYTES = env_int("APPLIANCE_STORE_CHUNK_BYTES", 1024 * 1024)
STORE_PARALLEL_FILES = env_int("APPLIANCE_STORE_PARALLEL_FILES", 4)
STORE_RETRIES = env_int("APPLIANCE_STORE_RETRIES", 20)
STORE_RETRY_S = env_int("APPLIANCE_STORE_RETRY_S", 30)
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
# The engine container's /dev/shm (NCCL and SGLang's shared-memory transport need a large
# one; the host's IPC namespace is never shared), its process cap and memory cap (none when
# empty: a 1T-parameter engine's host memory use is the operator's call).
ENGINE_SHM_SIZE = env_str("APPLIANCE_ENGINE_SHM_SIZE", "32g")
ENGINE_PIDS_LIMIT = env_int("APPLIANCE_ENGINE_PIDS_LIMIT", 8192)
ENGINE_MEMORY_LIMIT = env_str("APPLIANCE_ENGINE_MEMORY_LIMIT", "")
# The secret store: a spec's `secrets: [NAME]` is read from <ENGINE_SECRETS_DIR>/<NAME> (a
# compose secret or mounted folder), else from the engine agent's environment as
# APPLIANCE_ENGINE_SECRET_<NAME> (appliance/runtime/secrets.py).
ENGINE_SECRETS_DIR = env_str("APPLIANCE_ENGINE_SECRETS_DIR", "/run/secrets/engine")
# The same folder as the host sees it (compose mounts it at ENGINE_SECRETS_DIR): fix texts
# name this one, the place a person puts a secret's file.
ENGINE_SECRETS_HOST_DIR = env_str("APPLIANCE_ENGINE_SECRETS_HOST_DIR", "./engine-secrets")
# A spec's restart policy (appliance/engine/restart.py): the first wait before the agent
# starts an engine that died while serving, doubling up to the cap (seconds).
RESTART_BACKOFF_S = env_int("APPLIANCE_RESTART_BACKOFF_S", 10)
RESTART_BACKOFF_MAX_S = env_int("APPLIANCE_RESTART_BACKOFF_MAX_S", 300)
# Whether a spec's env may set the test engine's TEST_ENGINE_* knobs (the test suite only;
# appliance.engine.envkeys has the allowlist every spec's env keys are checked against).
ENGINE_TEST_ENV = env_bool("APPLIANCE_ENGINE_TEST_ENV", False)
# GPUs on the host when no agent has reported an NVML inventory: a spec's GPU ids must be
# below it (never unbounded; the product is one 8-GPU server). 0: a panel machine without
# GPUs, whose engines all run on joined hosts (the GPU-less trial).
GPU_COUNT = env_int("APPLIANCE_GPU_COUNT", 8)
if GPU_COUNT < 0:
    raise ValueError(f"APPLIANCE_GPU_COUNT={GPU_COUNT} must be 0 or more (the host's GPUs)")
# The panel's own GPU host's name: its row in fleet.FleetHost (its agent agent@<name>) and
# the host its GPU leases are taken on.
HOST_NAME = env_str("APPLIANCE_HOST_NAME", "gpu-host")
if not (1 <= len(HOST_NAME) <= 63 and slugify(HOST_NAME) == HOST_NAME):
    # Its agent joins under this name (the join's own rule, web/fleet/services.py
    # host_name_checked), and its rows are placed on the host row of that name.
    raise ValueError(f"APPLIANCE_HOST_NAME={HOST_NAME[:80]!r} is no host name: 1 to 63 "
                     "lowercase letters, digits and hyphens (e.g. gpu-host)")
# The file the panel loop keeps a usable join token for that host in (web/fleet/tokenfiles.py,
# at its start and hourly; `manage.py ownhost` writes the same by hand): its agent joins
# with it. compose mounts its folder read-write in `loop` alone, read-only in `agent`.
OWN_HOST_TOKEN_FILE = env_str("APPLIANCE_OWN_HOST_TOKEN_FILE", "/var/lib/appliance/own-host/token")
# Extra environment for every engine container (tests use it to pace the test engine).
ENGINE_EXTRA_ENV = dict(
    item.split("=", 1) for item in env_list("APPLIANCE_ENGINE_EXTRA_ENV") if "=" in item
)

# Engine metrics and alerts (the engine agent's monitor; appliance/runtime/series.py).
METRICS_INTERVAL_S = float(env_str("APPLIANCE_METRICS_INTERVAL_S", "2"))
METRICS_RETENTION_DAYS = env_int("APPLIANCE_METRICS_RETENTION_DAYS", 7)
# The event log's retention (docs/events-retention.md): decode/prefill stats lines are folded
# into the metric series after EVENTS_STATS_KEEP_HOURS, other log lines go after
# EVENTS_RETENTION_DAYS; what a diagnosis needs (errors, tracebacks, phases, diagnoses, the
# first and last lines of each run) is kept as long as the deployment.
EVENTS_RETENTION_DAYS = env_int("APPLIANCE_EVENTS_RETENTION_DAYS", 30)
EVENTS_STATS_KEEP_HOURS = env_int("APPLIANCE_EVENTS_STATS_KEEP_HOURS", 24)
if EVENTS_RETENTION_DAYS < 1 or EVENTS_STATS_KEEP_HOURS < 1:
    raise ValueError("APPLIANCE_EVENTS_RETENTION_DAYS and APPLIANCE_EVENTS_STATS_KEEP_HOURS must "
                     "be at least 1 (days and hours of the event log to keep)")
# No progress for this long while loading weights or capturing CUDA graphs: a stall alert.
ALERT_STALL_S = env_int("APPLIANCE_ALERT_STALL_S", 300)
# The appliance's own /metrics (Prometheus): this bearer token, or a logged-in viewer.
METRICS_TOKEN = env_str("APPLIANCE_METRICS_TOKEN", "")
# A joined host's agent: how often it reports (the host API's answers carry it; the agent
# beats at most a third of the lost threshold apart, so this bounds how soon a silent host
# shows), and how long the placements read holds the host for one agent process, whose
# writes alone are taken meanwhile (web/fleet/hostapi.py).
FLEET_HEARTBEAT_S = env_int("APPLIANCE_FLEET_HEARTBEAT_S", 10)
FLEET_AGENT_LEASE_S = env_int("APPLIANCE_FLEET_AGENT_LEASE_S", 15)
if FLEET_HEARTBEAT_S < 1 or FLEET_AGENT_LEASE_S < 3:
    raise ValueError("APPLIANCE_FLEET_HEARTBEAT_S is at least 1 and "
                     "APPLIANCE_FLEET_AGENT_LEASE_S at least 3 (seconds)")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"denied": {"()": "web.logfilters.DeniedWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["denied"]}},
    "root": {"handlers": ["console"], "level": env_str("APPLIANCE_LOG_LEVEL", "INFO")},
}
