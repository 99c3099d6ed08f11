"""Row locks for worker-scoped write paths — the only place workers and sessions are locked.

Global lock order (every write path takes its locks in this order, which rules out deadlocks):

    worker  ->  session  ->  run (by primary key)  ->  attempt  ->  lease

A worker-scoped path (registration, heartbeat writes, drain, offline, claim, ACKs, renew,
completion, revocation) locks the worker row first; everything it then reads about the worker's
sessions is serialised against every other such path. Sessions, attempts and leases are changed
under that lock with compare-and-swap updates, which take their own row locks in the order above.
On SQLite ``select_for_update`` is a no-op: IMMEDIATE transactions serialise all writers instead.

On PostgreSQL every session write path locks the worker row *before* it reads the session it
decides on, then reads the database clock (ADR-0012 §6, docs/leases.md, Renew and release);
``lock_worker_for_session``
serves paths that start from a session id (the expiry sweep) without reading the session first.
"""

from __future__ import annotations

import uuid

from core.errors import DomainError

from .models import Worker


def lock_worker(worker_id: uuid.UUID) -> Worker:
    """``SELECT … FOR UPDATE OF worker`` the worker row and return it (ADR-0012 §6).

    The first lock of every worker-scoped write path. PostgreSQL: blocks behind another holder
    up to ``lock_timeout`` (then ``lock_timeout``, 503, via ``write_path``); SQLite: a no-op
    inside the IMMEDIATE transaction. Raises ``worker_not_found`` if the worker does not exist.
    """
    worker = Worker.objects.select_for_update(of=("self",)).filter(pk=worker_id).order_by().first()
    if worker is None:
        raise DomainError("worker_not_found", "no such worker")
    return worker


def lock_worker_for_session(session_id: uuid.UUID) -> Worker | None:
    """``SELECT … FOR UPDATE OF worker`` the worker owning session ``session_id`` (ADR-0012 §6).

    For paths that start from a session id (the expiry sweep). One statement: the session row is
    only joined to find its worker, not read for a decision, so the caller reads it again under
    the lock. Returns ``None`` if no such session exists; lock waits as :func:`lock_worker`.
    """
    return Worker.objects.select_for_update(of=("self",)).filter(sessions__pk=session_id).first()
