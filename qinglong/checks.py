"""System checks that keep each storage profile honest (ADR-0012 §6, docs/sessions.md, Storage).

The cluster-control profile is several control-plane replicas: it must run on PostgreSQL (row
locks, one database clock) and on a shared cache (Redis) for replay nonces, rate limits and the
credential cache. SQLite or a per-process cache there would silently break fencing, so Django
refuses to start. The standalone profile refuses nothing: it is one process by definition.

Both profiles: the session lease must outlive the heartbeat cadence (``check_session_timings``),
the agent version policy must be usable (``check_agent_version_policy``), and a server process's
connection pool must hold a connection for every thread that can ask for one
(``check_connection_pool``).
"""

import math

import nodesemver
from django.conf import settings
from django.core import checks

from core.conf import protocol


@checks.register(checks.Tags.database, deploy=False)
def check_profile_storage(app_configs, **kwargs):
    """``cluster-control`` needs PostgreSQL (``qinglong.E001``) and a shared Redis cache
    (``qinglong.E002``); the standalone profile needs neither (ADR-0012 §6)."""
    errors = []
    if settings.QINGLONG_PROFILE != "cluster-control":
        return errors
    engine = settings.DATABASES["default"]["ENGINE"]
    if engine not in ("django.db.backends.postgresql", "qinglong.postgresql"):
        errors.append(
            checks.Error(
                "QINGLONG_PROFILE=cluster-control needs PostgreSQL; SQLite is never a cluster store.",
                hint="Set DATABASE_URL=postgres://… or use the standalone profile.",
                id="qinglong.E001",
            )
        )
    backend = settings.CACHES["default"]["BACKEND"]
    if not backend.endswith("RedisCache"):
        errors.append(
            checks.Error(
                "QINGLONG_PROFILE=cluster-control needs a shared cache for nonces and rate limits.",
                hint="Set REDIS_URL; the cluster profile uses Django's RedisCache.",
                id="qinglong.E002",
            )
        )
    return errors


#: Seconds an on-time heartbeat may spend in flight (network, queueing) before it must land.
HEARTBEAT_SAFETY_SECONDS = 1.0


@checks.register()
def check_session_timings(app_configs, **kwargs):
    """The session lease must outlive the heartbeat cadence (ADR-0012 §3, docs/sessions.md).

    A heartbeat extends the lease only once it has used more than half its TTL, so the next
    heartbeat — due at most ``interval × (1 + jitter)`` later — must land while the lease still
    runs: ``interval × (1 + jitter) + HEARTBEAT_SAFETY_SECONDS ≤ TTL / 2``. Otherwise a healthy
    worker's session would lapse between two on-time heartbeats and be fenced.
    """
    timings = protocol()
    errors = []
    interval, jitter, ttl = (
        timings.heartbeat_interval_seconds,
        timings.heartbeat_jitter_ratio,
        timings.session_lease_seconds,
    )
    if interval < 1 or not 0 <= jitter < 1 or ttl < 1:
        errors.append(
            checks.Error(
                f"session timings out of range: heartbeat {interval}s, jitter {jitter}, lease {ttl}s",
                hint="QINGLONG_HEARTBEAT_INTERVAL_SECONDS ≥ 1, 0 ≤ QINGLONG_HEARTBEAT_JITTER_RATIO < 1, "
                "QINGLONG_SESSION_LEASE_SECONDS ≥ 1.",
                id="qinglong.E003",
            )
        )
    elif interval * (1 + jitter) + HEARTBEAT_SAFETY_SECONDS > ttl / 2:
        errors.append(
            checks.Error(
                f"a {ttl}s session lease lapses between two on-time heartbeats "
                f"({interval}s ± {jitter:.0%}): the lease is extended only past half its life.",
                hint=f"Use QINGLONG_SESSION_LEASE_SECONDS ≥ {math.ceil(2 * (interval * (1 + jitter) + 1))} "
                "or a shorter QINGLONG_HEARTBEAT_INTERVAL_SECONDS.",
                id="qinglong.E003",
            )
        )
    return errors


@checks.register()
def check_agent_version_policy(app_configs, **kwargs):
    """The agent version policy (docs/operators.md) must be usable: ``MIN_AGENT_VERSION`` empty or
    a full semver, ``SUPPORTED_PROTOCOL_VERSIONS`` non-empty (``qinglong.E004``); otherwise every
    registration would fail."""
    policy = protocol()
    errors = []
    if policy.min_agent_version and nodesemver.valid(policy.min_agent_version, loose=False) is None:
        errors.append(
            checks.Error(
                f"QINGLONG_MIN_AGENT_VERSION={policy.min_agent_version!r} is not a semantic version",
                hint="Use a full version such as 0.2.0, or leave it empty for no minimum.",
                id="qinglong.E004",
            )
        )
    if not policy.supported_protocol_versions:
        errors.append(
            checks.Error(
                "QINGLONG_SUPPORTED_PROTOCOL_VERSIONS is empty: no agent could register",
                hint="List the protocol versions agents may speak, e.g. 1.",
                id="qinglong.E004",
            )
        )
    return errors


@checks.register(checks.Tags.database)
def check_connection_pool(app_configs, **kwargs):
    """A server process's pool (``manage.py serve``, docs/deploy.md "Threads and database
    connections") must have a connection for each request slot and each waiting-claim thread — as many
    threads as slots, ``QINGLONG_MAX_ACTIVE_REQUESTS`` each. With fewer, a request that got its
    slot waits for a connection and answers 503 ``database_unavailable`` while the database is up.
    """
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    if not isinstance(pool, dict):
        return []
    holders = 2 * settings.QINGLONG_SERVER["MAX_ACTIVE_REQUESTS"]
    if pool.get("max_size", holders) >= holders:
        return []
    return [
        checks.Error(
            f"a server process has {holders} threads that can hold a database connection "
            f"({settings.QINGLONG_SERVER['MAX_ACTIVE_REQUESTS']} request slots and as many waiting-claim "
            f"threads) and a pool of {pool['max_size']}.",
            hint=f"Use QINGLONG_DB_POOL_MAX_SIZE ≥ {holders}, or unset it (the default follows the slots).",
            id="qinglong.E005",
        )
    ]
