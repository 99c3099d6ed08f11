"""The session fence every worker call passes (ADR-0012 §2, PRODUCT invariants 2–3).

One function decides, in a fixed order, whether a call that names ``(session, generation,
expected version)`` may act. It raises a distinct code per fault and writes nothing, so a
refused call leaves no trace in the session tables. Callers hold the worker row lock when they
go on to write (``workers.locks``); the read-only heartbeat path calls it without a lock.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime

from qinglong.errors import DomainError

from .models import SessionState, Worker, WorkerSession, WorkerState


class Purpose(enum.Enum):
    """What the caller wants to do; only a claim is refused on a draining session."""

    HEARTBEAT = "heartbeat"
    DRAIN = "drain"
    OFFLINE = "offline"
    CLAIM = "claim"
    LEASE = "lease"  # ACKs, renew, release, completion of an existing lease


def fence_session(
    worker: Worker,
    *,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int | None,
    now: datetime,
    purpose: Purpose,
) -> WorkerSession:
    """Return the worker's session if it may act now; raise otherwise.

    ``now`` is the database clock (``qinglong.db.db_now``). ``expected_version`` is ``None``
    only for calls that do not change session state (claim and lease calls).

    Raises ``DomainError`` with, checked in this order: ``worker_revoked``,
    ``session_unknown`` (no such session *for this worker* — another worker's session id looks
    the same), ``session_superseded``, ``session_offline``, ``session_expired``,
    ``session_generation_mismatch``, ``session_version_conflict`` (carries the current version
    so the worker can re-read it), ``session_draining`` (claims only).
    """
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    session = WorkerSession.objects.filter(pk=session_id, worker_id=worker.pk).first()
    if session is None:
        raise DomainError("session_unknown", "no such session for this worker", field="sessionId")
    if session.state == SessionState.FENCED:
        raise DomainError("session_superseded", "a newer session replaced this one", field="sessionId")
    if session.state == SessionState.OFFLINE:
        raise DomainError("session_offline", "the session is offline", field="sessionId")
    if session.state == SessionState.EXPIRED or session.lease_expires_at <= now:
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
        raise DomainError("session_draining", "the session is draining and takes no new runs", field="sessionId")
    return session
