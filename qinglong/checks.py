"""System checks that keep each storage profile honest (ADR-0012 §6, docs/sessions.md, Storage).

The cluster-control profile is several control-plane replicas: it must run on PostgreSQL (row
locks, one database clock) and on a shared cache (Redis) for replay nonces, rate limits and the
credential cache. SQLite or a per-process cache there would silently break fencing, so Django
refuses to start. The standalone profile refuses nothing: it is one process by definition.

Both profiles: the session lease must outlive the heartbeat cadence (``check_session_timings``).
"""

import math

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
    if engine != "django.db.backends.postgresql":
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
