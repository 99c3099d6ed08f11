"""Heartbeat: keep a session alive and report free capacity (ADR-0012 §3, §5; ``docs/sessions.md`` Heartbeat
cost)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import F
from django.db.models.functions import Now

from core.db import db_now, write_path
from core.errors import DomainError
from leases.selectors import cancel_requested_attempt_ids
from workers.fence import Purpose, check_session, lock_and_fence
from workers.models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession
from workers.sessions import (
    SessionView,
    session_lease_ttl,
)


def _effective_slots(session: WorkerSession, available_slots: int) -> int:
    """A draining session has no capacity whatever the worker reports."""
    return 0 if session.state == SessionState.DRAINING else available_slots


def _lease_needs_extension(session: WorkerSession, now: datetime) -> bool:
    """The write rule's first half: extend only once the lease has used more than half its TTL."""
    return session.lease_expires_at - now < session_lease_ttl() / 2


def _heartbeat_needs_write(session: WorkerSession, available_slots: int, now: datetime) -> bool:
    return (
        _lease_needs_extension(session, now)
        or _effective_slots(session, available_slots) != session.available_slots
    )


def session_heartbeat(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int,
    available_slots: int,
) -> SessionView:
    """Keep a session alive and report its free capacity (ADR-0012 §3, §5).

    Arguments: the fence (``session_id``, ``generation`` ≥ 1, ``expected_version`` ≥ 0) and
    ``available_slots`` (0 – the session's ``max_concurrent_runs``).

    Write rule (docs/sessions.md "Heartbeat cost"): the session row is written only when
    (a) the lease has used more than half its TTL — then it is extended to DB now + TTL, the
    version unchanged — or (b) the effective ``available_slots`` changed — then they are stored
    and the version goes up by one. Any other heartbeat is a pure read: one statement reads the
    session, its worker and the database clock, the fence is checked, nothing is written. A
    draining session's capacity stays 0 whatever is reported. A write runs as its own
    transaction (``_heartbeat_write``) that locks the worker, re-reads and re-fences, so a
    heartbeat racing a replacement either lands first or is fenced — it never revives a session.

    Raises: every ``fence_session`` code, ``slots_exceed_maximum``, ``storage_busy``,
    ``lock_timeout``.
    """

    session = (
        WorkerSession.objects.select_related("worker")
        .annotate(db_now=Now())
        .filter(pk=session_id, worker_id=worker_id)
        .first()
    )
    if session is None:  # refused: revoked worker, or no such session for this worker (fence order)
        worker = Worker.objects.filter(pk=worker_id).first()
        if worker is None:
            raise DomainError("worker_not_found", "no such worker")
        check_session(
            worker,
            None,
            generation=generation,
            expected_version=expected_version,
            now=db_now(),
            purpose=Purpose.HEARTBEAT,
        )
        raise AssertionError("check_session accepts no missing session")
    now = session.db_now
    check_session(
        session.worker,
        session,
        generation=generation,
        expected_version=expected_version,
        now=now,
        purpose=Purpose.HEARTBEAT,
    )
    if available_slots > session.max_concurrent_runs:
        raise DomainError(
            "slots_exceed_maximum",
            f"availableSlots {available_slots} is above maxConcurrentRuns {session.max_concurrent_runs}",
            field="availableSlots",
        )
    view = SessionView(session=session, server_time=now)
    if _heartbeat_needs_write(session, available_slots, now):
        view = _heartbeat_write(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            expected_version=expected_version,
            available_slots=available_slots,
        )
    return SessionView(
        session=view.session,
        server_time=view.server_time,
        cancel_requested=tuple(cancel_requested_attempt_ids(session_id)),
        rotation_required=session.worker.rotation_required,
    )


@write_path
def _heartbeat_write(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int,
    available_slots: int,
) -> SessionView:
    """The heartbeat's write, under the worker lock: extend the lease and/or store new slots."""
    fenced = lock_and_fence(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        purpose=Purpose.HEARTBEAT,
    )
    session, now = fenced.session, fenced.now
    slots = _effective_slots(session, available_slots)
    updates: dict[str, object] = {}
    if _lease_needs_extension(session, now):
        updates["lease_expires_at"] = now + session_lease_ttl()
    if slots != session.available_slots:
        updates["available_slots"] = slots
        updates["version"] = F("version") + 1
    if updates:
        # The fence is in the WHERE clause too: a lapsed or ended session is never extended.
        changed = WorkerSession.objects.filter(
            pk=session.pk,
            generation=generation,
            version=expected_version,
            state__in=LIVE_SESSION_STATES,
            lease_expires_at__gt=now,
        ).update(**updates)
        if changed != 1:
            raise DomainError(
                "session_version_conflict", "the session changed under the heartbeat", field="expectedVersion"
            )
        session.refresh_from_db()
    return SessionView(session=session, server_time=now)


def session_keep_alive(*, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int) -> SessionView:
    """A waiting claim's heartbeat (docs/sessions.md, "Waiting claims keep the session alive").

    Fenced by session and generation like a claim (``Purpose.LEASE``: a draining session passes).
    The heartbeat's write rule without the slots: the lease is extended to DB now + TTL once it
    has used more than half its TTL, else this is a pure read; the version never changes, so a
    keep-alive never conflicts with a heartbeat or an operator's drain. While the claim waits,
    :func:`sessions_keep_alive` keeps the lease. Returns the session as a heartbeat answers it
    (cancellations, rotation).

    Raises: every ``fence_session`` code, ``storage_busy``, ``lock_timeout``.
    """
    session = (
        WorkerSession.objects.select_related("worker")
        .annotate(db_now=Now())
        .filter(pk=session_id, worker_id=worker_id)
        .first()
    )
    if session is None:
        worker = Worker.objects.filter(pk=worker_id).first()
        if worker is None:
            raise DomainError("worker_not_found", "no such worker")
        check_session(
            worker, None, generation=generation, expected_version=None, now=db_now(), purpose=Purpose.LEASE
        )
        raise AssertionError("check_session accepts no missing session")
    now = session.db_now
    check_session(
        session.worker, session, generation=generation, expected_version=None, now=now, purpose=Purpose.LEASE
    )
    view = SessionView(session=session, server_time=now)
    if _lease_needs_extension(session, now):
        view = _keep_alive_write(worker_id=worker_id, session_id=session_id, generation=generation)
    return SessionView(
        session=view.session,
        server_time=view.server_time,
        cancel_requested=tuple(cancel_requested_attempt_ids(session_id)),
        rotation_required=session.worker.rotation_required,
    )


@write_path
def _keep_alive_write(*, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int) -> SessionView:
    """The keep-alive's write, under the worker lock: extend the lease to DB now + TTL."""
    fenced = lock_and_fence(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=None,
        purpose=Purpose.LEASE,
    )
    session, now = fenced.session, fenced.now
    changed = WorkerSession.objects.filter(
        pk=session.pk, generation=generation, state__in=LIVE_SESSION_STATES, lease_expires_at__gt=now
    ).update(lease_expires_at=now + session_lease_ttl())
    if changed != 1:
        raise DomainError("session_expired", "the session lease lapsed", field="sessionId")
    session.refresh_from_db()
    return SessionView(session=session, server_time=now)


#: Session ids per statement of :func:`sessions_keep_alive` (SQLite bounds a statement's size).
KEEP_ALIVE_CHUNK = 500


@write_path
def sessions_keep_alive(*, sessions: list[tuple[uuid.UUID, int]]) -> int:
    """Keep the sessions of held waiting claims alive: one statement per 500 of them.

    ``sessions``: (session id, generation) of each waiting claim a server process holds (its
    worker is connected and waiting). Every session still live (online or draining), of that
    generation and not yet lapsed is extended to DB now + TTL once less than half its TTL is left;
    an ended, replaced or lapsed one is never touched (the ``UPDATE … WHERE`` is the fence), nor
    its version. Called every half heartbeat interval by ``api.waiting``. Returns rows extended.
    """
    if not sessions:
        return 0
    now = db_now()
    by_generation: dict[int, list[uuid.UUID]] = {}
    for session_id, generation in sessions:
        by_generation.setdefault(generation, []).append(session_id)
    extended = 0
    for generation, ids in sorted(by_generation.items()):
        for start in range(0, len(ids), KEEP_ALIVE_CHUNK):
            extended += WorkerSession.objects.filter(
                pk__in=ids[start : start + KEEP_ALIVE_CHUNK],
                generation=generation,
                state__in=LIVE_SESSION_STATES,
                lease_expires_at__gt=now,
                lease_expires_at__lt=now + session_lease_ttl() / 2,
            ).update(lease_expires_at=now + session_lease_ttl())
    return extended
