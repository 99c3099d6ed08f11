"""System checks that keep each storage profile honest (ADR-0012 §6, PRODUCT storage profiles).

The cluster-control profile is several control-plane replicas: it must run on PostgreSQL (row
locks, one database clock) and on a shared cache (Redis) for replay nonces, rate limits and the
credential cache. SQLite or a per-process cache there would silently break fencing, so Django
refuses to start. The standalone profile refuses nothing: it is one process by definition.
"""

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.database, deploy=False)
def check_profile_storage(app_configs, **kwargs):
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
