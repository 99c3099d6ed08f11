"""Django settings for the QingLong control plane.

Everything a platform engineer sets comes from the environment (django-environ); the defaults
give the zero-setup *standalone* profile: one control-plane process on an embedded SQLite file.
``QINGLONG_PROFILE=cluster-control`` selects the multi-replica profile (PostgreSQL, Redis cache
and nonce store, Celery beat sweeps); ``qinglong.checks`` refuses a cluster profile on SQLite or
on a per-process cache.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("QINGLONG_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")

PROFILES = ("standalone", "cluster-control")
QINGLONG_PROFILE = env.str("QINGLONG_PROFILE", default="standalone")
if QINGLONG_PROFILE not in PROFILES:
    raise ImproperlyConfigured(
        f"QINGLONG_PROFILE={QINGLONG_PROFILE!r} is not a known profile; use one of {', '.join(PROFILES)}"
    )
CLUSTER = QINGLONG_PROFILE == "cluster-control"


def _secret_key() -> str:
    """The cluster profile must be given a key; standalone keeps one in VAR_DIR (mode 0600)."""
    configured = env.str("DJANGO_SECRET_KEY", default="")
    if configured:
        return configured
    if CLUSTER:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set in the cluster-control profile")
    path = VAR_DIR / "secret-key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "console.apps.ConsoleAdminConfig",  # Django's admin, landing on the fleet dashboard
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_ratelimit",
    "qinglong",
    "audit",
    "workers",
    "runs",
    "placement",
    "leases",
    "logs",
    "accounts",
    "schedules",
    "console",
]

MIDDLEWARE = [
    "api.observability.ObservabilityMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "api.middleware.NulRefusalMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "api.middleware.BodyLimitMiddleware",
    "api.middleware.ConsoleSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "api.middleware.ConsoleAuthenticationMiddleware",
    "api.middleware.ConsoleMessageMiddleware",
    "console.middleware.OperatorTimezoneMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
#: What only the console (the admin, operators' browser sessions) needs: static files, sessions,
#: CSRF, users, messages, the operator's timezone. None of them acts on a worker API request
#: (the worker views are CSRF-exempt, the console ones skip ``/api/v1/worker/``), so that road
#: leaves them out in ``manage.py serve`` (``qinglong.handlers.WorkerAPIHandler``).
CONSOLE_ONLY_MIDDLEWARE = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "api.middleware.ConsoleSessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "api.middleware.ConsoleAuthenticationMiddleware",
        "api.middleware.ConsoleMessageMiddleware",
        "console.middleware.OperatorTimezoneMiddleware",
    }
)
#: The worker API's middleware: ``MIDDLEWARE`` in its order, less the console's.
WORKER_API_MIDDLEWARE = [name for name in MIDDLEWARE if name not in CONSOLE_ONLY_MIDDLEWARE]

ROOT_URLCONF = "qinglong.urls"
WSGI_APPLICATION = "qinglong.wsgi.application"
ASGI_APPLICATION = "qinglong.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

# Requests inside Django's synchronous code at once, per server process (a thread each; also
# as many waiting-claim threads): QINGLONG_SERVER's, and what the connection pool is sized by.
_request_slots = env.int("QINGLONG_MAX_ACTIVE_REQUESTS", default=8)

# --- storage -----------------------------------------------------------------------------------
#: psycopg's ``prepare_threshold`` that never prepares a query by count: only on request.
PG_PREPARE_ONLY_ASKED = 2**31 - 1
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'qinglong.sqlite3'}"),
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # One writer at a time: every transaction.atomic() begins IMMEDIATE, so a read-check-write
    # inside it cannot interleave with another writer; `timeout` is SQLite's busy timeout
    # (seconds) and core.db.retry_on_busy adds a bounded, jittered retry above it.
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": env.float("QINGLONG_SQLITE_BUSY_TIMEOUT_SECONDS", default=2.5),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
        }
    )
    # Tests use a real file (WAL, separate connections) rather than a shared in-memory database.
    _db["TEST"] = {"NAME": str(VAR_DIR / "test-qinglong.sqlite3")}
    if _db["NAME"] != ":memory:":
        Path(_db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
elif _db["ENGINE"] in ("django.db.backends.postgresql",):
    _db.setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)
    # A claim or transition blocked behind a held row lock waits this long, then fails with the
    # `lock_timeout` code (core.db.write_path) instead of hanging a worker request.
    _db["OPTIONS"]["options"] = f"-c lock_timeout={env.int('QINGLONG_PG_LOCK_TIMEOUT_MS', default=5000)}"
    # Django turns psycopg's prepared statements off (for transaction-mode poolers). The hot
    # paths' statements ask for one each (core.db.prepared_row, prepare=True): parsed
    # and planned once per connection, not on every call. This threshold keeps every other query
    # unprepared; QINGLONG_PG_PREPARED_STATEMENTS=false turns preparing off entirely, for a pooler
    # that cannot keep them (docs/deploy.md, "Connection poolers").
    _db["OPTIONS"]["prepare_threshold"] = (
        PG_PREPARE_ONLY_ASKED if env.bool("QINGLONG_PG_PREPARED_STATEMENTS", default=True) else None
    )
    _db["CONN_MAX_AGE"] = env.int("QINGLONG_DB_CONN_MAX_AGE", default=60)
    _db["CONN_HEALTH_CHECKS"] = True
    if env.bool("QINGLONG_SERVE_DB_POOL", default=False):  # core.conf.SERVE_DB_POOL_VARIABLE
        # Set by `manage.py serve` for its server processes only (spawned, never forked: a pool
        # does not survive a fork), shared by the request threads and the waiting claims'
        # threads (docs/deploy.md, "Threads and database connections"). It checks a connection
        # before handing it out, without a round trip (qinglong.postgresql), and gives up a
        # reconnection after `reconnect_timeout` seconds, so after an outage a connection is
        # tried again at most that long after the database is back — well within a session
        # lease — instead of after psycopg_pool's doubling backoff of up to five minutes.
        _db["CONN_MAX_AGE"] = 0  # the pool keeps the connections; Django must not
        _db["ENGINE"] = "qinglong.postgresql"  # checks each pooled connection (qinglong.pgpool)
        _db["CONN_HEALTH_CHECKS"] = False  # Django's would be an empty query per checkout
        _db["OPTIONS"]["pool"] = {
            "name": "qinglong",
            "min_size": env.int("QINGLONG_DB_POOL_MIN_SIZE", default=2),
            # A connection for each request slot and each waiting-claim thread (api.waiting: as
            # many as the slots), and two spare; qinglong.E005 refuses a smaller pool.
            "max_size": env.int("QINGLONG_DB_POOL_MAX_SIZE", default=2 * _request_slots + 2),
            "timeout": env.float("QINGLONG_DB_POOL_TIMEOUT_SECONDS", default=2.0),
            "reconnect_timeout": env.float("QINGLONG_DB_POOL_RECONNECT_SECONDS", default=3.0),
        }
else:
    raise ImproperlyConfigured(
        f"DATABASE_URL selects {_db['ENGINE']}; only SQLite and PostgreSQL are supported"
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- caches: rate limits, replay nonces, credential keys -----------------------------------------
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
if CLUSTER or env.bool("QINGLONG_SHARED_CACHE", default=False):
    # core.cache.RedisCache: Django's backend, reusing one Redis client per pool (docs/performance.md).
    # Bounded socket timeouts: a Redis that is stopped or hangs makes a request answer
    # `cache_unavailable` (503) within seconds instead of holding it (core.dependencies).
    _redis_timeout = env.float("QINGLONG_REDIS_TIMEOUT_SECONDS", default=2.0)
    _shared = {
        "BACKEND": "core.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"socket_connect_timeout": _redis_timeout, "socket_timeout": _redis_timeout},
    }
    CACHES = {"default": {**_shared, "KEY_PREFIX": "ql"}}
else:
    # standalone is one control-plane process: a per-process cache is the whole truth there.
    # (Rate-limit counters and cached credentials live here; replay nonces do not: see
    # workers.nonces — an LRU cache may forget them.)
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "qinglong",
            "OPTIONS": {"MAX_ENTRIES": 50_000},
        }
    }
RATELIMIT_USE_CACHE = "default"
# Rate limits per client address (enrollment, failed worker authentication) key on REMOTE_ADDR.
# Behind a reverse proxy, name the META key holding the single client address it sets (for
# example HTTP_X_REAL_IP); never a header a client can forge past the proxy.
RATELIMIT_IP_META_KEY = env.str("QINGLONG_CLIENT_ADDRESS_META_KEY", default="") or None
SILENCED_SYSTEM_CHECKS = [
    # django-ratelimit only knows django_redis; Django's own RedisCache increments atomically,
    # and the locmem cache is shared by everything in the single standalone process.
    # qinglong.checks refuses locmem in the cluster profile.
    "django_ratelimit.E003",
    "django_ratelimit.W001",
]

# --- Celery (cluster profile: beat runs the sweeps) --------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "sweep-cycle": {
        "task": "qinglong.tasks.sweep_cycle",
        "schedule": env.float("QINGLONG_SWEEP_INTERVAL_SECONDS", default=5.0),
    },
}

# --- auth, i18n, static ------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# Times to the second in the console (the operator's timezone: console.middleware).
FORMAT_MODULE_PATH = ["console.formats"]
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise serves the admin's files from the finders
_OUTPUT_BACKEND = env.str("QINGLONG_OUTPUT_STORAGE", default="django.core.files.storage.FileSystemStorage")
_OUTPUT_OPTIONS = (
    {"location": env.str("QINGLONG_OUTPUT_DIR", default=str(VAR_DIR / "output"))}
    if _OUTPUT_BACKEND.endswith(".FileSystemStorage")
    else {}
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Compacted job logs and artifacts (docs/logs.md). Any Django storage backend fits, e.g. an
    # S3-compatible store through django-storages in the cluster profile (every replica must
    # reach the same store): set QINGLONG_OUTPUT_STORAGE to its dotted class path.
    "output": {"BACKEND": _OUTPUT_BACKEND, "OPTIONS": _OUTPUT_OPTIONS},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- operator API tokens (django-rest-knox; docs/operators.md) ---------------------------------
# Stored as SHA-512 digests in accounts.ApiToken (named, role-scoped); shown once when created.
KNOX_TOKEN_MODEL = "accounts.ApiToken"
# knox's own migrations create its default token table even when the model is swapped; with no
# migrations for knox, nothing of it is created (a swapped model is never synced either).
MIGRATION_MODULES = {"knox": None}
REST_KNOX = {
    "AUTH_HEADER_PREFIX": "Token",
    "TOKEN_PREFIX": "qlops_",
    "TOKEN_TTL": timedelta(days=env.int("QINGLONG_API_TOKEN_TTL_DAYS", default=30)),
    "AUTO_REFRESH": False,
}

# --- REST framework ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_PARSER_CLASSES": ["api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # Nothing is open by default: every view names its authentication and permission.
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["api.permissions.DenyAll"],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "api.exceptions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "api.schema.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": [],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "QingLong remote worker control plane",
    "DESCRIPTION": (
        "Worker API under /api/v1/worker/ (every request RFC 9421-signed with the worker's Ed25519 key; "
        "see docs/transport.md) and operator API under /api/v1/ops/ (staff token or session). Every "
        'refusal answers {"code", "message", "field"} with a stable code (`manage.py error_codes` '
        "prints them all)."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/v1/docs: Swagger UI from the installed drf-spectacular-sidecar, nothing from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No online validator badge (Swagger UI would fetch it from validator.swagger.io).
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {},
}

# --- protocol timings and limits (core.conf reads these; units in the names) ----------------
# A session lease is about seven heartbeat intervals (70 s at 10 s, 100 s at 15 s): it is extended
# only past half its life (docs/sessions.md), so even with the ±10 % jitter the third heartbeat
# after an extension finds more than half left and the fourth extends — three of four unchanged
# heartbeats write nothing — and a heartbeat that is missed still finds the lease live. A run's
# loss is noticed by its run lease, not by this.
_profile_defaults = {
    "standalone": {
        "session_ttl": 70,
        "heartbeat": 10,
        "run_lease_ttl": 30,
        "dispatch_timeout": 30,
        "lost_after": 120,
    },
    "cluster-control": {
        "session_ttl": 100,
        "heartbeat": 15,
        "run_lease_ttl": 60,
        "dispatch_timeout": 60,
        "lost_after": 180,
    },
}[QINGLONG_PROFILE]
QINGLONG = {
    "SESSION_LEASE_SECONDS": env.int(
        "QINGLONG_SESSION_LEASE_SECONDS", default=_profile_defaults["session_ttl"]
    ),
    "HEARTBEAT_INTERVAL_SECONDS": env.int(
        "QINGLONG_HEARTBEAT_INTERVAL_SECONDS", default=_profile_defaults["heartbeat"]
    ),
    "HEARTBEAT_JITTER_RATIO": env.float("QINGLONG_HEARTBEAT_JITTER_RATIO", default=0.1),
    "RUN_LEASE_SECONDS": env.int("QINGLONG_RUN_LEASE_SECONDS", default=_profile_defaults["run_lease_ttl"]),
    "DISPATCH_TIMEOUT_SECONDS": env.int(
        "QINGLONG_DISPATCH_TIMEOUT_SECONDS", default=_profile_defaults["dispatch_timeout"]
    ),
    "CLAIM_POLL_SECONDS": env.float("QINGLONG_CLAIM_POLL_SECONDS", default=1.0),
    "TAKEOVERS_PER_MINUTE": env.int("QINGLONG_TAKEOVERS_PER_MINUTE", default=6),
    "SIGNATURE_WINDOW_SECONDS": env.int("QINGLONG_SIGNATURE_WINDOW_SECONDS", default=60),
    # How far ahead of the server's clock a signature's `created` may be. The agent signs with its
    # clock aligned to the server's Date header (never ahead of it), so a small allowance is
    # enough.
    "SIGNATURE_FUTURE_SKEW_SECONDS": env.int("QINGLONG_SIGNATURE_FUTURE_SKEW_SECONDS", default=2),
    "ENROLLMENT_TOKEN_TTL_SECONDS": env.int("QINGLONG_ENROLLMENT_TOKEN_TTL_SECONDS", default=24 * 3600),
    "ROTATION_GRACE_SECONDS": env.int("QINGLONG_ROTATION_GRACE_SECONDS", default=300),
    "CREDENTIAL_CACHE_SECONDS": env.int("QINGLONG_CREDENTIAL_CACHE_SECONDS", default=30),
    "SQLITE_BUSY_RETRIES": env.int("QINGLONG_SQLITE_BUSY_RETRIES", default=3),
    "DISPATCH_HOLD_SECONDS": env.float("QINGLONG_DISPATCH_HOLD_SECONDS", default=10.0),
    "RATE_WORKER": env.str("QINGLONG_RATE_WORKER", default="600/m"),
    "RATE_ENROLL": env.str("QINGLONG_RATE_ENROLL", default="10/m"),
    # Failed worker authentications per client address (forged, stale, replayed, unknown key).
    "RATE_AUTH_FAILURES": env.str("QINGLONG_RATE_AUTH_FAILURES", default="120/m"),
    "SWEEP_BATCH": env.int("QINGLONG_SWEEP_BATCH", default=64),
    # Outages of the control plane itself (docs/leases.md, Outages): every serving process beats
    # a liveness row this often; a gap longer than OUTAGE_AFTER is an outage, after which lapsed
    # sessions and run leases are not settled for OUTAGE_GRACE (default: one heartbeat interval
    # plus the agent's longest backoff, 8 s, and a round trip), so that workers can reach it again.
    "LIVENESS_BEAT_SECONDS": env.float("QINGLONG_LIVENESS_BEAT_SECONDS", default=2.0),
    "OUTAGE_AFTER_SECONDS": env.float("QINGLONG_OUTAGE_AFTER_SECONDS", default=6.0),
    "OUTAGE_GRACE_SECONDS": env.float(
        "QINGLONG_OUTAGE_GRACE_SECONDS", default=_profile_defaults["heartbeat"] + 10.0
    ),
    # The hard deadline of a run lease that gets no answer (docs/leases.md, Hard deadline): a
    # worker that cannot reach the control plane keeps its job this long past the lease's
    # expiry, and a lost attempt's retry is not due before it. A task revision may set its own.
    "LOST_AFTER_SECONDS": env.int("QINGLONG_LOST_AFTER_SECONDS", default=_profile_defaults["lost_after"]),
    # Agent version policy (docs/operators.md "Upgrades"): a registration from an agent older
    # than this semver, or speaking a protocol version not listed, is refused with
    # `agent_version_unsupported` and the agent exits for good (status 6). "" = no minimum.
    "MIN_AGENT_VERSION": env.str("QINGLONG_MIN_AGENT_VERSION", default=""),
    "SUPPORTED_PROTOCOL_VERSIONS": tuple(
        env.list("QINGLONG_SUPPORTED_PROTOCOL_VERSIONS", cast=int, default=[1])
    ),
    # Waiting claims (docs/leases.md "Waiting claims"): the longest wait the server grants (also
    # bounded by the session lease less one heartbeat interval), and how often a waiting process
    # probes the queue for work whose wake-up it missed.
    "CLAIM_WAIT_MAX_SECONDS": env.float("QINGLONG_CLAIM_WAIT_MAX_SECONDS", default=30.0),
    "CLAIM_WAIT_RECHECK_SECONDS": env.float("QINGLONG_CLAIM_WAIT_RECHECK_SECONDS", default=2.0),
}

# --- job output: live logs and artifacts (logs/, actions/logs.py, actions/artifacts.py; docs/logs.md)
QINGLONG_OUTPUT = {
    # Stored bytes of one attempt's log; past it one truncation marker and nothing more.
    "LOG_MAX_BYTES": env.int("QINGLONG_LOG_MAX_BYTES", default=16 * 1024 * 1024),
    # How often an agent sends its buffered output when less than a full chunk is waiting (the
    # answer's intervalSeconds, like GitLab's 3 s trace update interval; doubled while the attempt
    # logs faster than half the rate below). A full chunk is sent at once.
    "LOG_INTERVAL_SECONDS": env.float("QINGLONG_LOG_INTERVAL_SECONDS", default=3.0),
    # Bytes per second one attempt may log; beyond, chunks are refused with log_backpressure (429).
    "LOG_RATE_BYTES_PER_SECOND": env.int("QINGLONG_LOG_RATE_BYTES_PER_SECOND", default=4 * 1024 * 1024),
    # Log and artifact requests per worker (their own bucket, besides RATE_WORKER's).
    "RATE_OUTPUT": env.str("QINGLONG_RATE_OUTPUT", default="6000/m"),
}

# --- serving (manage.py serve: Granian + qinglong.serving.RequestGuard; docs/deploy.md) ------------
QINGLONG_SERVER = {
    # Connections one server process holds at once (Granian's backpressure); more wait in the
    # listen backlog. Slow clients, keep-alive agents and (issue 18) long polls each hold one.
    "MAX_CONNECTIONS": env.int("QINGLONG_MAX_CONNECTIONS", default=4096),
    "BACKLOG": env.int("QINGLONG_LISTEN_BACKLOG", default=1024),
    # A client must send its whole request head within this long (also the idle keep-alive limit).
    "HEADER_TIMEOUT_SECONDS": env.float("QINGLONG_HEADER_TIMEOUT_SECONDS", default=10.0),
    # ... and its whole body within this long after the head; then 408 and the connection closes.
    "BODY_TIMEOUT_SECONDS": env.float("QINGLONG_BODY_TIMEOUT_SECONDS", default=10.0),
    # Header fields per request (431 beyond) and the read buffer that bounds the header block.
    "MAX_HEADERS": env.int("QINGLONG_MAX_HEADERS", default=64),
    "MAX_HEADER_BYTES": env.int("QINGLONG_MAX_HEADER_BYTES", default=16 * 1024),
    # Any body (413 beyond): the operator API's largest limit (96 KiB) plus headroom; the
    # per-endpoint limits (api.middleware.BodyLimitMiddleware) are smaller.
    "MAX_BODY_BYTES": env.int("QINGLONG_MAX_BODY_BYTES", default=128 * 1024),
    "MAX_ACTIVE_REQUESTS": _request_slots,
}

# --- health and metrics (api.health, api.metrics; docs/operations.md) ------------------------------
# /readyz fails its `sweeps` check when no sweep cycle finished within this many seconds.
QINGLONG_READY_SWEEP_MAX_AGE_SECONDS = env.int("QINGLONG_READY_SWEEP_MAX_AGE_SECONDS", default=60)
# /metrics answers a request from these networks, or one bearing `Authorization: Bearer <token>`.
QINGLONG_METRICS_ALLOW = env.list("QINGLONG_METRICS_ALLOW", default=["127.0.0.1/32", "::1/128"])
QINGLONG_METRICS_TOKEN = env.str("QINGLONG_METRICS_TOKEN", default="")
# Several processes write the same counters (Granian's server processes, the sweep loop, Celery):
# prometheus_client keeps each process's values in a file here and a scrape sums them. It reads
# the variable when it is first imported, which is after settings load.
PROMETHEUS_MULTIPROC_DIR = Path(env.str("PROMETHEUS_MULTIPROC_DIR", default=str(VAR_DIR / "metrics")))
PROMETHEUS_MULTIPROC_DIR.mkdir(parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(PROMETHEUS_MULTIPROC_DIR)

# --- logs: plain lines, or JSON lines with QINGLONG_LOG_FORMAT=json (python-json-logger) ----------
LOG_FORMAT = env.str("QINGLONG_LOG_FORMAT", default="plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"QINGLONG_LOG_FORMAT={LOG_FORMAT!r}: use plain or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "api.observability.RequestIdFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(process)d",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["request_id"]}
    },
    "root": {"handlers": ["console"], "level": env.str("QINGLONG_LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.request": {"level": "ERROR"},
        # The access log: one line per request answered by Django (api.observability).
        "qinglong.access": {"level": env.str("QINGLONG_ACCESS_LOG_LEVEL", default="INFO")},
        # Granian's own lines (start, worker processes, errors) go through the same handler.
        "_granian": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        "granian.access": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        "celery": {"level": "INFO"},
        # Django logs a foreign Host header at ERROR with a traceback; anyone could flood that.
        # The 400 answer logs one warning line instead (api.exceptions.bad_request).
        "django.security.DisallowedHost": {"handlers": [], "propagate": False},
    },
}
