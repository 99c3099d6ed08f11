"""core.dependencies: a real unreachable dependency maps onto its catalogued 503, and an outage is
one warning line per state change, not one per request (docs/leases.md, Dependency outages)."""

from __future__ import annotations

import logging
import socket

import pytest
import redis
from django.db import OperationalError, connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from core import dependencies
from core.dependencies import dependency_error, note_recovery


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe is closed


def redis_failure() -> Exception:
    # No retries: redis-py's default (three, with backoff) takes ~4 s to give up on a closed port.
    client = redis.Redis(port=closed_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.ConnectionError) as failed:
        client.ping()
    return failed.value


def test_an_unreachable_redis_is_cache_unavailable_with_retry_after():
    note_recovery("cache")
    error = dependency_error(redis_failure())
    assert error is not None
    assert (error.code, error.status, error.retry_after) == ("cache_unavailable", 503, 2)


def test_a_failure_wrapped_in_another_exception_is_found_through_its_cause():
    try:
        try:
            raise redis_failure()
        except redis.ConnectionError as exc:
            raise RuntimeError("a library re-raised it") from exc
    except RuntimeError as wrapped:
        error = dependency_error(wrapped)
    assert error is not None and error.code == "cache_unavailable"


@pytest.mark.django_db
def test_a_lost_database_connection_is_database_unavailable(settings):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no server to lose; its locks are storage_busy")
    broken = connection.copy()
    broken.settings_dict = {**connection.settings_dict, "PORT": closed_port()}
    with pytest.raises(OperationalError) as failed:
        broken.ensure_connection()
    error = dependency_error(failed.value)
    assert error is not None and error.code == "database_unavailable"


def test_anything_else_is_not_a_dependency_failure():
    assert dependency_error(ValueError("a bug")) is None


def test_an_outage_is_one_warning_until_recovery_then_one_more(caplog):
    note_recovery("cache")
    caplog.set_level(logging.WARNING, logger=dependencies.log.name)
    caplog.clear()
    for _ in range(5):
        dependency_error(redis_failure())
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["cache unavailable"]
    note_recovery("cache")
    note_recovery("cache")
    assert caplog.records[-1].getMessage() == "cache reachable again" and len(caplog.records) == 2
    dependency_error(redis_failure())
    assert len(caplog.records) == 3
    note_recovery("cache")
