"""Shared pytest setup: database-leg markers, Redis availability, common fixtures."""

from __future__ import annotations

import os

import pytest
import redis
from django.conf import settings as django_settings
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache

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
