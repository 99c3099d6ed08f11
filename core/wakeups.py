"""Wake-ups for waiting claims (issue 18; ``docs/leases.md`` "Waiting claims"): sent on commit.

A write path that makes work claimable or changes what a worker's waiting request should answer
calls one of the two functions below inside its transaction:

* :func:`work_ready` — an attempt became claimable (enqueue, a retry became due, an unstarted
  lease was released back to the queue), with its placement class as the hint, so that only
  waiters whose capabilities match that class are woken;
* :func:`worker_changed` — something about one worker changed (its session drained, undrained,
  replaced, expired or went offline, the worker was revoked, one of its leases ended — capacity
  freed — or a run it holds was asked to cancel).

Both stores send a transaction's wake-ups once it has committed (``transaction.on_commit``),
never for a rollback; outside a transaction, at once. On PostgreSQL they are ``pg_notify`` on
:data:`CHANNEL`, all of one transaction in one statement of their own (:func:`notify`), which
PostgreSQL delivers to every listening connection (every replica's waiters, ``api.waiting``). That
statement's commit does not wait for the disk (``synchronous_commit`` off for it alone): a
``NOTIFY`` holds one lock for the whole database from its commit until the commit is flushed, so
a notification inside a durable write transaction would queue every notifying commit behind the
one before it and its flush (docs/performance.md). On SQLite (the single standalone process) it
is an in-process call to the subscribers. Wake-ups are hints: a lost one costs latency, never
correctness (waiters re-check on a slow timer).

Nobody listening, nothing sent (PostgreSQL): a process holds its LISTEN connection only while
some request waits there (``api.waiting``), under the application name
:data:`LISTENER_APPLICATION`. The release's and the completion's one statement read
:data:`LISTENING_SQL` after their writes, and when no such connection is open they send no
wake-up — no statement after the commit. A busy fleet (every worker working, none waiting) then
pays nothing for wake-ups (docs/performance.md, "Wake-ups only while someone waits"). A LISTEN
connection that opens between that read and the write's commit would miss it; the hub wakes its
waiters when the connection opens and once more :data:`~api.waiting.LISTEN_SETTLE_SECONDS`
later, so they claim what such a write committed.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

from django.db import connection, transaction

from core.db import call_function

log = logging.getLogger(__name__)

#: The PostgreSQL notification channel; payloads are ``c:<placement sha256>`` or ``w:<worker id>``.
CHANNEL = "qinglong_wake"

#: The ``application_name`` of the LISTEN connections (``api.waiting``).
LISTENER_APPLICATION = "qinglong-wake"
#: A column for a hot write path's one statement: whether any process of this database holds a
#: LISTEN connection now (``pg_stat_activity`` shows every role's application names).
LISTENING_SQL = (
    "EXISTS (SELECT 1 FROM pg_stat_activity"
    f" WHERE application_name = '{LISTENER_APPLICATION}' AND datname = current_database())"
)
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


#: One statement sends a list of payloads; its commit alone is asynchronous (see above).
_NOTIFY_SQL = (
    "SELECT count(pg_notify(%b::text, payload)), set_config('synchronous_commit', 'off', true)"
    " FROM unnest(%b::text[]) AS payload"
)


class _Batch:
    """The wake-ups of one transaction, sent by one on-commit callback (:meth:`send`)."""

    def __init__(self, payloads: list[str] | None = None) -> None:
        self.payloads: list[str] = payloads or []

    def send(self) -> None:
        if connection.vendor == "postgresql":
            notify(self.payloads)
        else:
            for payload in dict.fromkeys(self.payloads):
                publish_local(payload)

    def registered(self) -> bool:
        """Whether :meth:`send` still waits for this thread's transaction to commit (it is gone
        once the transaction or the savepoint that registered it ended)."""
        return any(entry[1] == self.send for entry in connection.run_on_commit)


_batches = threading.local()


def notify(payloads: list[str]) -> None:
    """PostgreSQL: send ``payloads`` (each once) now, as one statement that is its own transaction
    (or joins the caller's, whose commit then delivers them). Errors are logged, never raised: a
    wake-up is a hint and the write it follows has committed."""
    try:
        call_function(_NOTIFY_SQL, [CHANNEL, list(dict.fromkeys(payloads))])
    except Exception:
        log.warning("wake-ups not sent (%d); waiters find the change on their re-check", len(payloads))


def _emit(payloads: list[str]) -> None:
    if not connection.in_atomic_block:
        _Batch(payloads).send()
    else:
        batch = getattr(_batches, "current", None)
        if batch is None or not batch.registered():
            _batches.current = batch = _Batch()
            transaction.on_commit(batch.send, robust=True)
        batch.payloads.extend(payloads)


def work_ready(placement_sha256: str) -> None:
    """On commit, wake waiters that can run work of this placement class (64 hex digits)."""
    _emit([WORK_PREFIX + placement_sha256])


def worker_changed(worker_id: uuid.UUID | str) -> None:
    """On commit, wake this worker's waiting requests (they re-check fence, capacity, cancels)."""
    _emit([WORKER_PREFIX + str(worker_id)])


def worker_and_work(worker_id: uuid.UUID | str, placement_sha256: str) -> None:
    """:func:`worker_changed` and :func:`work_ready` together (one statement on PostgreSQL): a
    lease that ended before its attempt started frees the worker's capacity and requeues work."""
    _emit([WORKER_PREFIX + str(worker_id), WORK_PREFIX + placement_sha256])
