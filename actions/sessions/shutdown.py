"""Drain and offline: a session stops taking work, then ends (ADR-0012 §5; ``docs/sessions.md`` Drain and
offline)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import F

from actions.sessions.endings import end_session
from audit.models import ActorType
from audit.recorder import record
from core.db import db_now, write_path
from core.errors import DomainError
from leases.selectors import active_lease_count
from leases.settlement import settle_session_leases
from workers.fence import Purpose, lock_and_fence, refence_after_miss
from workers.locks import lock_worker
from workers.models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession
from workers.sessions import (
    SessionView,
)


@write_path
def session_drain(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, expected_version: int
) -> SessionView:
    """The worker enters ``draining`` on shutdown (ADR-0012 §5.3–5.4).

    Arguments: the fence (``session_id``, ``generation``, ``expected_version``). In one
    transaction under the worker lock: state ``draining``, capacity 0, version + 1, a
    ``session.drained`` event. Heartbeats stay valid (with capacity held at 0), claims are
    refused with ``session_draining``, started attempts continue (ACK, renew, complete); the
    session stays draining until it goes offline or its lease lapses. Draining a draining
    session (with its current version) is an idempotent success that writes nothing. A worker's
    own drain lasts for this process only; an operator drain (``worker_drain``) also makes the
    worker's later sessions start draining.

    Raises: every ``fence_session`` code, ``storage_busy``, ``lock_timeout``.
    """
    fenced = lock_and_fence(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        purpose=Purpose.DRAIN,
    )
    worker, session, now = fenced.worker, fenced.session, fenced.now
    if session.state == SessionState.DRAINING:
        return SessionView(session=session, server_time=now)
    changed = WorkerSession.objects.filter(
        pk=session.pk, version=expected_version, state=SessionState.ONLINE
    ).update(state=SessionState.DRAINING, drained_by="worker", available_slots=0, version=F("version") + 1)
    if changed != 1:
        refence_after_miss(
            worker,
            session,
            generation=generation,
            expected_version=expected_version,
            now=now,
            purpose=Purpose.DRAIN,
            what="drain",
        )
    session.refresh_from_db()
    record(
        "session.drained",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation, "by": "worker"},
    )
    return SessionView(session=session, server_time=now)


def _take_offline(
    worker: Worker,
    session: WorkerSession,
    *,
    now: datetime,
    force: bool,
    actor_type: str,
    actor: str,
    role: str = "",
) -> SessionView:
    """End a live session ``offline`` (caller holds the worker lock and fenced the session)."""

    active = active_lease_count(session.pk)
    if active and not force:
        raise DomainError(
            "session_has_active_leases",
            f"the session still holds {active} active run lease(s); finish or release them first",
            field="sessionId",
            details={"activeLeases": active},
        )
    reason = (
        "worker_offline"
        if actor_type == ActorType.WORKER
        else ("forced_offline" if active else "operator_offline")
    )
    end_session(session, state=SessionState.OFFLINE, reason=reason, now=now)
    settled = (
        settle_session_leases(session, reason="session_offline", now=now, actor_type=actor_type, actor=actor)
        if active
        else 0
    )
    data: dict[str, object] = {"generation": session.generation, "forced": force, "settled_leases": settled}
    if role:
        data["role"] = role
    record(
        "session.offline",
        actor_type=actor_type,
        actor=actor,
        worker_id=worker.pk,
        session_id=session.pk,
        data=data,
    )
    return SessionView(session=session, server_time=now)


@write_path
def session_offline(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, expected_version: int, actor: str = ""
) -> SessionView:
    """The worker ends its session cleanly (ADR-0012 §5.5). Refused while it holds run leases.

    Arguments: the fence (``session_id``, ``generation``, ``expected_version``); ``actor`` the
    worker's name for the audit row. Allowed from ``online`` and ``draining``. Under the worker
    lock (so no claim can slip in): if the session holds no active run lease, in one
    transaction: state ``offline``, capacity 0, version + 1, ``ended_at``, a ``session.offline``
    event; the session can never act again. A worker cannot force: only an operator can take a
    session with active leases offline (:func:`session_operator_offline`).

    Raises: every ``fence_session`` code, ``session_has_active_leases`` (409,
    ``details.activeLeases``), ``storage_busy``, ``lock_timeout``.
    """
    fenced = lock_and_fence(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        purpose=Purpose.OFFLINE,
    )
    worker, session, now = fenced.worker, fenced.session, fenced.now
    return _take_offline(worker, session, now=now, force=False, actor_type=ActorType.WORKER, actor=actor)


@write_path
def session_operator_offline(
    *, worker_id: uuid.UUID, force: bool = False, actor: str = "", role: str = ""
) -> SessionView:
    """Operator: take the worker's live session offline now (admin action, ``manage.py
    session_offline``; ADR-0012 §5, docs/sessions.md, Drain and offline).

    Arguments: ``worker_id``; ``force`` whether to proceed although the session holds active
    run leases; ``actor`` the operator's username, ``role`` the role it acts under. Without
    ``force`` it is refused like the worker's own offline. With ``force`` the session's active
    leases are settled in the same transaction (``leases.settlement``, reason
    ``session_offline``): started attempts become
    ``lost`` and are retried or failed per their policy, unstarted ones return to the queue.
    The worker's next call is refused with ``session_offline``; a new process may register.

    Locks: the worker row. Raises: ``worker_not_found``, ``no_live_session``,
    ``session_has_active_leases``, ``storage_busy``, ``lock_timeout``.
    """
    worker = lock_worker(worker_id)
    now = db_now()
    session = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if session is None:
        raise DomainError("no_live_session", "the worker has no online or draining session")
    return _take_offline(
        worker, session, now=now, force=force, actor_type=ActorType.OPERATOR, actor=actor, role=role
    )
