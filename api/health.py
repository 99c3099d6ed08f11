"""``/healthz`` (liveness) and ``/readyz`` (readiness): JSON, no authentication, no secrets.

``/healthz`` answers 200 as long as the process serves requests; it calls nothing.
``/readyz`` answers 200 when every check passes and 503 naming the failing ones:

* ``database`` — the default database answers ``SELECT 1``;
* ``migrations`` — no migration is left unapplied (checked until it passes once per process);
* ``cache`` — the cluster profile's Redis answers a write and a read (standalone: per-process
  memory, always ``ok``);
* ``sweeps`` — a sweep cycle finished within ``QINGLONG_READY_SWEEP_MAX_AGE_SECONDS``
  (``audit.SweepMark``, any replica's or Celery beat's cycle).

A failure names its check and the exception *class* only: connection strings and messages
(which may hold host names or passwords) never reach the answer; they go to the log.
docs/operations.md.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from audit.marks import sweep_mark_age
from workers.principals import cache_is_shared

log = logging.getLogger("qinglong.health")

_migrated = False  # once every migration is applied it stays so for this process's code


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: ``{"status": "ok"}``, 200, without touching any dependency."""
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_migrations() -> str:
    global _migrated
    if not _migrated:
        connection = connections[DEFAULT_DB_ALIAS]
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if pending:
            return f"failed: {len(pending)} unapplied migration(s)"
        _migrated = True
    return "ok"


def _check_cache() -> None:
    probe = f"readyz:{uuid.uuid4().hex}"
    cache.set(probe, 1, timeout=5)
    if cache.get(probe) != 1:
        raise RuntimeError("the cache did not return what was written")
    cache.delete(probe)


def _check_sweeps() -> str:
    age = sweep_mark_age()
    limit = settings.QINGLONG_READY_SWEEP_MAX_AGE_SECONDS
    if age is None:
        return "failed: no sweep cycle has finished yet"
    if age.total_seconds() > limit:
        return f"failed: the last sweep cycle finished {int(age.total_seconds())} s ago (limit {limit} s)"
    return "ok"


def _run(name: str, check) -> str:
    try:
        result = check()
    except Exception as exc:  # any failure of a dependency means "not ready", never a 500
        log.warning("readiness check %s failed: %s: %s", name, type(exc).__name__, exc)
        return f"failed: {type(exc).__name__}"
    return result if isinstance(result, str) else "ok"


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: ``{"status": "ready"|"unavailable", "checks": {name: "ok"|"failed: …"},
    "failing": [names]}``; 200 when all pass, else 503 (checks listed in the module docstring)."""
    checks = {"database": _run("database", _check_database)}
    if checks["database"] == "ok":
        checks["migrations"] = _run("migrations", _check_migrations)
    else:
        checks["migrations"] = "failed: database unreachable"
    checks["cache"] = _run("cache", _check_cache) if cache_is_shared() else "ok"
    if checks["migrations"] == "ok":
        checks["sweeps"] = _run("sweeps", _check_sweeps)
    else:
        checks["sweeps"] = "failed: database not ready"
    failing = [name for name, result in checks.items() if result != "ok"]
    body = {"status": "unavailable" if failing else "ready", "checks": checks, "failing": failing}
    return JsonResponse(body, status=503 if failing else 200)
