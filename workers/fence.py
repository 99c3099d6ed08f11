"""The session fence every worker call passes (ADR-0012 §2, docs/sessions.md, fail-closed matrix).

One function decides, in a fixed order, whether a call that names ``(session, generation,
expected version)`` may act. It raises a distinct code per fault and writes nothing, so a
refused call leaves no trace in the session tables. Write paths call it while holding the worker
row lock (``workers.locks``) and with ``now`` read from the database *after* that lock; the
read-only heartbeat path calls :func:`check_session` on a row it read together with the
database clock in one statement.

The order of the checks, and which call may act on a draining session, is the fail-closed
matrix of ``docs/sessions.md`` (the matrix test in ``tests/workers/test_sessions_matrix.py``
keeps the two equal):

1. ``worker_revoked`` (403) — the worker is revoked (normally refused earlier, by
   authentication, as ``credential_revoked``);
2. ``session_unknown`` (404) — no such session *for this worker* (another worker's session id
   looks exactly the same);
3. ``session_superseded`` (409) — a newer session replaced it (state ``fenced``);
4. ``session_offline`` (409) — it went offline;
5. ``session_expired`` (409) — its lease lapsed by the database clock, swept or not (unless the
   lapse fell into an outage of the control plane and its grace window is open: docs/leases.md,
   Outages);
6. ``session_generation_mismatch`` (409);
7. ``session_version_conflict`` (409, ``details.currentVersion``) — only for calls that change
   session state (heartbeat, drain, offline);
8. ``session_draining`` (409) — only for a claim of new work.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import NoReturn

from audit.liveness import lapse_excused
from core.db import db_now
from core.errors import DomainError

from .locks import lock_worker
from .models import SessionState, Worker, WorkerSession, WorkerState


class Purpose(enum.Enum):
    """What the caller wants to do; only a claim is refused on a draining session."""

    REGISTER = "register"  # an exact replay of a registration
    HEARTBEAT = "heartbeat"
    DRAIN = "drain"
    OFFLINE = "offline"
    CLAIM = "claim"
    LEASE = "lease"  # ACKs, renew, release, completion of an existing lease


def check_session(
    worker: Worker,
    session: WorkerSession | None,
    *,
    generation: int,
    expected_version: int | None,
    now: datetime,
    purpose: Purpose,
) -> WorkerSession:
    """Apply the ordered fence checks to an already loaded ``session`` (``None``: not found).

    ``session`` must have been looked up by id *and* ``worker`` (a row of another worker is
    "unknown"). ``now`` is the database clock read no earlier than ``session``. Returns the
    session; raises ``DomainError`` with the codes listed in the module docstring, in that order.
    """
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    if session is None or session.worker_id != worker.pk:
        raise DomainError("session_unknown", "no such session for this worker", field="sessionId")
    if session.state == SessionState.FENCED:
        raise DomainError("session_superseded", "a newer session replaced this one", field="sessionId")
    if session.state == SessionState.OFFLINE:
        raise DomainError("session_offline", "the session is offline", field="sessionId")
    if session.state == SessionState.EXPIRED or not lapse_excused(session.lease_expires_at, now):
        # A lease that lapsed while the control plane could not serve is excused for the grace
        # window after it serves again (audit.liveness; docs/leases.md, Outages).
        raise DomainError("session_expired", "the session lease lapsed", field="sessionId")
    if session.generation != generation:
        raise DomainError(
            "session_generation_mismatch", f"the session's generation is not {generation}", field="generation"
        )
    if expected_version is not None and session.version != expected_version:
        raise DomainError(
            "session_version_conflict",
            f"expected version {expected_version}, the session is at {session.version}",
            field="expectedVersion",
            details={"currentVersion": session.version, "state": session.state},
        )
    if purpose is Purpose.CLAIM and session.state == SessionState.DRAINING:
        raise DomainError(
            "session_draining", "the session is draining and takes no new runs", field="sessionId"
        )
    return session


def refence_after_miss(
    worker: Worker,
    session: WorkerSession,
    *,
    generation: int,
    expected_version: int,
    now: datetime,
    purpose: Purpose,
    what: str,
) -> NoReturn:
    """A compare-and-swap on a session row that the fence had passed changed no row: re-fence on
    the row as it is now and raise. On PostgreSQL a heartbeat is one statement that takes no
    worker lock, so it can move the version between a locked fence's read and its write; the
    re-fence then raises ``session_version_conflict`` with ``details.currentVersion`` (or the code
    of whatever else changed), which the worker adopts for its one retry. Raises
    ``session_version_conflict`` naming ``what`` if the row passes the fence again."""
    session.refresh_from_db()
    check_session(
        worker, session, generation=generation, expected_version=expected_version, now=now, purpose=purpose
    )
    raise DomainError(
        "session_version_conflict", f"the session changed under the {what}", field="expectedVersion"
    )


def fence_session(
    worker: Worker,
    *,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int | None,
    now: datetime,
    purpose: Purpose,
) -> WorkerSession:
    """Load the worker's session ``session_id`` and return it if it may act now; raise otherwise.

    Arguments: ``worker`` the (locked, for write paths) worker row; ``generation`` ≥ 1;
    ``expected_version`` the session version the caller last saw, ``None`` only for calls that
    do not change session state (claim and lease calls, registration replays); ``now`` the
    database clock (``core.db.db_now``) read after the caller's locks. Writes nothing.

    Raises ``DomainError``: see :func:`check_session` (ADR-0012 §2: "any field mismatch, an
    expired lease, or a worker already offline fails closed").
    """
    session = WorkerSession.objects.filter(pk=session_id, worker_id=worker.pk).first()
    return check_session(
        worker, session, generation=generation, expected_version=expected_version, now=now, purpose=purpose
    )


@dataclass(frozen=True)
class FencedSession:
    """What a worker write path holds once it passed the session fence: the locked worker row,
    its session, and the database clock read after the lock."""

    worker: Worker
    session: WorkerSession
    now: datetime


def lock_and_fence(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int | None,
    purpose: Purpose,
) -> FencedSession:
    """The opening of every fenced worker write path (ADR-0012 §2, §6; ``docs/sessions.md``).

    Locks the worker row (``workers.locks.lock_worker``), reads the database clock *after* the
    lock, then passes :func:`fence_session`. Call it inside the write path's one transaction.
    Raises ``worker_not_found`` and every code of :func:`check_session`; writes nothing.
    """
    worker = lock_worker(worker_id)
    now = db_now()
    session = fence_session(
        worker,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        now=now,
        purpose=purpose,
    )
    return FencedSession(worker=worker, session=session, now=now)


def read_and_fence(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, purpose: Purpose
) -> FencedSession:
    """:func:`lock_and_fence` without the worker row lock, for a high-rate call that changes no
    worker or session state (a live log chunk, docs/logs.md, Rate): the worker row is read, not
    locked, so the call never queues behind (or holds up) that worker's claims and heartbeats.
    The caller must then lock a row that every state change it depends on also locks (the run:
    lease settlement locks it), and decide on the lease's state read under that lock.
    Raises ``worker_not_found`` and every code of :func:`check_session`; writes nothing."""
    worker = Worker.objects.filter(pk=worker_id).order_by().first()
    if worker is None:
        raise DomainError("worker_not_found", "no such worker")
    now = db_now()
    session = fence_session(
        worker, session_id=session_id, generation=generation, expected_version=None, now=now, purpose=purpose
    )
    return FencedSession(worker=worker, session=session, now=now)
