"""How a live session ends inside another write path: ended in place, expired or fenced (ADR-0012 §2, §3).

Private to the write paths that hold the worker lock (registration, offline, expiry,
revocation, re-enrollment); each settles the session's run leases in the caller's transaction
(``leases.settlement``). They open no transaction of their own.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import F

from audit.recorder import record
from core.errors import DomainError
from leases.settlement import settle_session_leases
from workers.models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession


def end_session(session: WorkerSession, *, state: str, reason: str, now: datetime) -> None:
    """CAS a live session to an ended state (capacity 0, version + 1).

    The caller holds the worker lock and has just read the session live, so zero rows changed
    means the locking discipline was broken: raise rather than write half a transition.
    """
    changed = WorkerSession.objects.filter(pk=session.pk, state__in=LIVE_SESSION_STATES).update(
        state=state, end_reason=reason, ended_at=now, available_slots=0, version=F("version") + 1
    )
    if changed != 1:
        raise DomainError(
            "session_version_conflict", "the session changed under the transition", field="sessionId"
        )
    # Under the worker lock nothing else moved the row: mirror the update instead of re-reading.
    session.state, session.end_reason, session.ended_at, session.available_slots = state, reason, now, 0
    session.version += 1


def expire_session(
    session: WorkerSession, *, now: datetime, actor_type: str, lapsed_by: datetime | None = None
) -> bool:
    """Mark a live session whose lease lapsed (by ``lapsed_by``, default ``now``) ``expired``, settle
    its run leases and record ``session.expired``. The CAS re-checks state and expiry; False if it
    changed nothing. The sweep passes ``audit.liveness.expiry_cutoff`` as ``lapsed_by``."""

    changed = WorkerSession.objects.filter(
        pk=session.pk, state__in=LIVE_SESSION_STATES, lease_expires_at__lte=lapsed_by or now
    ).update(
        state=SessionState.EXPIRED,
        end_reason="lease_expired",
        ended_at=now,
        available_slots=0,
        version=F("version") + 1,
    )
    if not changed:
        return False
    session.refresh_from_db()
    settled = settle_session_leases(session, reason="session_expired", now=now, actor_type=actor_type)
    record(
        "session.expired",
        actor_type=actor_type,
        worker_id=session.worker_id,
        session_id=session.pk,
        data={"generation": session.generation, "settled_leases": settled},
    )
    return True


def fence_live_session(
    worker: Worker,
    *,
    reason: str,
    now: datetime,
    actor_type: str,
    actor: str = "",
    current: WorkerSession | None = None,
) -> WorkerSession | None:
    """Fence the worker's live session, if any, and settle its run leases (same transaction).

    For write paths that hold the worker lock (replacement, revocation, re-enrollment).
    ``reason``: ``superseded``, ``revoked`` or ``re_enrolled`` (keys of
    ``leases.settlement.SESSION_END_REASONS``);
    ``current``: the live session if the caller already read it under the lock. Writes: the
    session row (state ``fenced``, capacity 0, version + 1), a ``session.fenced`` event and
    whatever ``leases.settlement`` writes (started attempts lost, unstarted ones back in the
    queue). Returns the fenced session, or ``None`` if none was live.
    """

    if current is None:
        current = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if current is None:
        return None
    end_session(current, state=SessionState.FENCED, reason=reason, now=now)
    settled = settle_session_leases(current, reason=reason, now=now, actor_type=actor_type, actor=actor)
    record(
        "session.fenced",
        actor_type=actor_type,
        actor=actor,
        worker_id=worker.pk,
        session_id=current.pk,
        data={"reason": reason, "generation": current.generation, "settled_leases": settled},
    )
    return current
