"""What an unreachable dependency means for a request: a catalogued 503, never a 500 (docs/leases.md).

The control plane depends on its database (SQLite or PostgreSQL) and, in the cluster profile,
on Redis (replay nonces, rate limits, cached credentials). When one of them fails, every request
that needs it is answered with a stable code and ``Retry-After`` — the worker's action for all
three is ``retry`` — instead of Django's HTML 500 with a traceback:

* PostgreSQL unreachable, or the connection lost (``OperationalError``/``InterfaceError``) →
  ``database_unavailable``;
* a statement cancelled by ``statement_timeout`` (SQLSTATE 57014) → ``statement_timeout``;
  a lock not granted (55P03) outside a write path → ``lock_timeout``; SQLite locked → ``storage_busy``;
* Redis unreachable or timing out (``redis.ConnectionError``/``TimeoutError``, raised through
  Django's cache, the rate limiter or the nonce store) → ``cache_unavailable``.

:func:`dependency_error` maps an exception (or one in its cause/context chain) onto that code;
:func:`note_failure` and :func:`note_recovery` keep one warning log line per change of a
dependency's state per process, so an outage is one line, not a traceback per request.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import InterfaceError, OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.errors import DomainError

log = logging.getLogger("core.dependencies")

#: Seconds a client is told to wait (``Retry-After``) when a dependency is unreachable: about
#: the time a database failover or a Redis restart takes; the agent backs off at least this long.
RETRY_AFTER_SECONDS = 2

#: A dependency that failed and was not seen failing again for this long is taken as recovered
#: (for processes with no prober, such as a test server), so a later outage is logged again.
QUIET_RECOVERY_SECONDS = 30.0

_PG_QUERY_CANCELED = "57014"
_PG_LOCK_NOT_AVAILABLE = "55P03"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _classify(exc: BaseException) -> tuple[str, str, str] | None:
    """(dependency, code, message) for a dependency failure, None for anything else."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return "cache", "cache_unavailable", "the cache (Redis) is unreachable; retry"
    if isinstance(exc, OperationalError | InterfaceError):
        sqlstate = getattr(exc.__cause__, "sqlstate", None)
        if sqlstate == _PG_QUERY_CANCELED:
            return "database", "statement_timeout", "a database statement timed out; retry"
        if sqlstate == _PG_LOCK_NOT_AVAILABLE:
            return "database", "lock_timeout", "a row lock was not granted in time; retry"
        if "database is locked" in str(exc):
            return "database", "storage_busy", "the database is busy; retry"
        return "database", "database_unavailable", "the database is unreachable; retry"
    return None


def dependency_error(exc: BaseException) -> DomainError | None:
    """The catalogued 503 that ``exc`` means, or None if it is not a dependency failure.

    Looks at ``exc`` and its ``__cause__``/``__context__`` chain (a cache error re-raised by a
    library, a database error wrapped by another). Records the failure (:func:`note_failure`).
    Returns a ``DomainError`` with ``retry_after`` = :data:`RETRY_AFTER_SECONDS`.
    """
    for link in _chain(exc):
        found = _classify(link)
        if found is not None:
            dependency, code, message = found
            note_failure(dependency, code, link)
            return DomainError(code, message, retry_after=RETRY_AFTER_SECONDS)
    return None


class _Watch:
    """Per-process state of each dependency: up, or down since when (for one log line each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down: dict[str, float] = {}  # dependency → monotonic time of its latest failure

    def failed(self, dependency: str, code: str, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._down.get(dependency)
            self._down[dependency] = now
        if last is None or now - last > QUIET_RECOVERY_SECONDS:
            log.warning("%s unavailable (%s): %s: %s", dependency, code, type(exc).__name__, exc)

    def recovered(self, dependency: str) -> None:
        with self._lock:
            was_down = self._down.pop(dependency, None) is not None
        if was_down:
            log.warning("%s reachable again", dependency)

    def is_down(self, dependency: str) -> bool:
        with self._lock:
            return dependency in self._down


_WATCH = _Watch()


def note_failure(dependency: str, code: str, exc: BaseException) -> None:
    """Record that ``dependency`` (``database`` | ``cache``) failed; logs one WARNING line when it
    was up (or quiet for :data:`QUIET_RECOVERY_SECONDS`), nothing while it stays down."""
    _WATCH.failed(dependency, code, exc)


def note_recovery(dependency: str) -> None:
    """Record that ``dependency`` answered again (called by the liveness beat's probe); logs one
    WARNING line if it had been down."""
    _WATCH.recovered(dependency)


def is_down(dependency: str) -> bool:
    """Whether this process saw ``dependency`` fail and not yet recover."""
    return _WATCH.is_down(dependency)
