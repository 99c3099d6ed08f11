"""Wake-ups for waiting claims (issue 18; ``docs/leases.md`` "Waiting claims"): sent on commit.

A write path that makes work claimable or changes what a worker's waiting request should answer
calls one of the two functions below inside its transaction:

* :func:`work_ready` — an attempt became claimable (enqueue, a retry became due, an unstarted
  lease was released back to the queue), with its placement class as the hint, so that only
  waiters whose capabilities match that class are woken;
* :func:`worker_changed` — something about one worker changed (its session drained, undrained,
  replaced, expired or went offline, the worker was revoked, one of its leases ended — capacity
  freed — or a run it holds was asked to cancel).

On PostgreSQL the wake-up is ``pg_notify`` on :data:`CHANNEL` inside the transaction: PostgreSQL
delivers it to every listening connection (every replica's waiters, ``api.waiting``) only when
the transaction commits, never for a rollback. On SQLite (the single standalone process) it is
an in-process call to the subscribers, made by ``transaction.on_commit``. Wake-ups are hints:
a lost one costs latency, never correctness (waiters re-check on a slow timer).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

from django.db import connection, transaction

log = logging.getLogger(__name__)

#: The PostgreSQL notification channel; payloads are ``c:<placement sha256>`` or ``w:<worker id>``.
CHANNEL = "qinglong_wake"
WORK_PREFIX = "c:"
WORKER_PREFIX = "w:"

_subscribers: list[Callable[[str], None]] = []
_subscribers_lock = threading.Lock()


def subscribe(callback: Callable[[str], None]) -> None:
    """Receive this process's committed wake-up payloads (SQLite; PostgreSQL uses LISTEN).

    ``callback(payload)`` runs on the committing thread: it must only hand the payload on."""
    with _subscribers_lock:
        _subscribers.append(callback)


def unsubscribe(callback: Callable[[str], None]) -> None:
    with _subscribers_lock:
        if callback in _subscribers:
            _subscribers.remove(callback)


def publish_local(payload: str) -> None:
    """Hand ``payload`` to this process's subscribers (what a commit does on SQLite)."""
    with _subscribers_lock:
        callbacks = list(_subscribers)
    for callback in callbacks:
        try:
            callback(payload)
        except Exception:  # a wake-up is a hint: never fail the committed write path over it
            log.exception("wake-up subscriber failed")


def _emit(payload: str) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
    else:
        transaction.on_commit(lambda: publish_local(payload))


def work_ready(placement_sha256: str) -> None:
    """On commit, wake waiters that can run work of this placement class (64 hex digits)."""
    _emit(WORK_PREFIX + placement_sha256)


def worker_changed(worker_id: uuid.UUID | str) -> None:
    """On commit, wake this worker's waiting requests (they re-check fence, capacity, cancels)."""
    _emit(WORKER_PREFIX + str(worker_id))
