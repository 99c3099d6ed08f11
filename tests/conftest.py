"""Shared pytest setup: database-leg markers, Redis availability, common fixtures."""

from __future__ import annotations

import os
import time
import warnings

import pytest
import redis
from django.conf import settings as django_settings
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.db import OperationalError
from django.db.backends.base.operations import BaseDatabaseOperations

from api.waiting import HUB

CI = os.environ.get("CI", "").lower() == "true"


def _vendor() -> str:
    engine = django_settings.DATABASES["default"]["ENGINE"]
    return "postgresql" if "postgresql" in engine else "sqlite"


def pytest_collection_modifyitems(config, items):
    vendor = _vendor()
    for item in items:
        if "postgres" in item.keywords and vendor != "postgresql":
            item.add_marker(pytest.mark.skip(reason="PostgreSQL-only test; runs in the PostgreSQL leg"))
        if "sqlite" in item.keywords and vendor != "sqlite":
            item.add_marker(pytest.mark.skip(reason="SQLite-only test; runs in the SQLite leg"))


#: SQLSTATEs of a flush that met another connection's locks: deadlock_detected, lock_not_available.
_FLUSH_LOCK_CONFLICTS = {"40P01", "55P03"}


def _holders(ops: BaseDatabaseOperations) -> list[tuple]:
    """The other connections to the test database: what a flush's TRUNCATE waited for."""
    with ops.connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, application_name, now() - xact_start, left(query, 200) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchall()


@pytest.fixture(scope="session", autouse=True)
def _flush_reports_lock_conflicts():
    """A transactional test's teardown (``flush``: one ``TRUNCATE`` of every table) that meets a
    lock another connection still holds — a server thread still answering the test's last request
    — reports who held it (a warning in the summary) and flushes again once that has ended, instead
    of failing the test after it passed. PostgreSQL only; any other error still fails."""
    original = BaseDatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        for attempt in range(3):
            try:
                return original(self, sql_list)
            except OperationalError as exc:
                sqlstate = getattr(exc.__cause__, "sqlstate", None)
                conflict = self.connection.vendor == "postgresql" and sqlstate in _FLUSH_LOCK_CONFLICTS
                if not conflict or attempt == 2:
                    raise
                test = os.environ.get("PYTEST_CURRENT_TEST", "?")
                warnings.warn(f"flush after {test} met {sqlstate}; others: {_holders(self)}", stacklevel=1)
                time.sleep(1)

    BaseDatabaseOperations.execute_sql_flush = execute_sql_flush
    yield
    BaseDatabaseOperations.execute_sql_flush = original


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The real Redis server; skipped when down, except under CI=true where that fails."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        if CI:
            pytest.fail(f"Redis at {url} is unreachable under CI=true: {exc}")
        pytest.skip(f"Redis at {url} is unreachable: {exc}")
    return url


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty per-process cache (nonces, rate-limit counters, credentials).

    Only the locmem cache is cleared: ``clear()`` on a Redis cache would FLUSHDB a shared server.
    """
    cache = caches["default"]
    if isinstance(cache, LocMemCache):
        cache.clear()
    yield
    if isinstance(cache, LocMemCache):
        cache.clear()


@pytest.fixture(autouse=True)
def _waiting_claims_released():
    """A test that made requests wait (``api.waiting``) leaves no hub thread and no pool
    connection behind: they would outlive its database."""
    yield
    if HUB.used:
        HUB.release()


@pytest.fixture
def protocol_settings(settings):
    """Adjust ``settings.QINGLONG`` keys for one test: ``protocol_settings(RUN_LEASE_SECONDS=4)``."""

    def apply(**values):
        settings.QINGLONG = {**settings.QINGLONG, **values}

    return apply
