"""Session registration: a process start registers, replays or is refused (ADR-0012 §2, §3, §6;
``docs/sessions.md``)."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta

from django.db import IntegrityError
from django.db.models import Count, Min

from actions.sessions.endings import expire_session, fence_live_session
from audit.models import ActorType, Event
from audit.recorder import record
from core.conf import protocol
from core.db import Refusal, UniqueRace, db_now, is_unique_violation, write_path
from core.errors import DomainError
from protocol.capabilities import CapabilitySnapshot
from protocol.ids import is_uuid7
from workers.fence import Purpose, check_session
from workers.locks import lock_worker
from workers.models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession, WorkerState
from workers.sessions import (
    SessionView,
    check_slots,
    registration_sha256,
    session_lease_ttl,
)

#: The window the takeover limit counts replacements in (ADR-0012 §2, rejected alternative 6).
TAKEOVER_WINDOW = timedelta(minutes=1)


def _takeover_refusal(worker: Worker, now: datetime) -> Refusal | None:
    """The takeover-storm limit: at most ``TAKEOVERS_PER_MINUTE`` replacements per worker per
    minute. Counted from ``session.replaced`` events (indexed by worker, kind, time)."""
    limit = protocol().takeovers_per_minute
    window = Event.objects.filter(
        worker_id=worker.pk, kind="session.replaced", created_at__gt=now - TAKEOVER_WINDOW
    ).aggregate(count=Count("id"), oldest=Min("created_at"))
    if window["count"] < limit:
        return None
    # Retry once the oldest counted replacement leaves the window.
    wait = (window["oldest"] + TAKEOVER_WINDOW - now).total_seconds()
    retry_after = min(60, max(1, math.ceil(wait)))
    record(
        "session.takeover_limited",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        data={"limit": limit, "retry_after_s": retry_after},
    )
    return Refusal(
        DomainError(
            "session_takeover_limited",
            f"this worker's session was replaced {window['count']} times in the last minute (limit {limit})",
            retry_after=retry_after,
            details={"limit": limit},
        )
    )


def _replay(worker: Worker, existing: WorkerSession, digest: str, now: datetime) -> SessionView | Refusal:
    """A registration naming a session id that exists: an exact replay, or a refusal."""
    if existing.worker_id == worker.pk and existing.registration_sha256 == digest:
        # Same process asking again (a lost response): answer as before, if it still may act.
        check_session(
            worker,
            existing,
            generation=existing.generation,
            expected_version=None,
            now=now,
            purpose=Purpose.REGISTER,
        )
        replaced = Event.objects.filter(kind="session.replaced", session_id=existing.pk).exists()
        return SessionView(session=existing, server_time=now, replayed=True, replaced_session=replaced)
    same_worker = existing.worker_id == worker.pk
    record(
        "session.replay_conflict",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        # Another worker's session id is not named in this worker's audit trail.
        session_id=existing.pk if same_worker else None,
        data={"reason": "content_differs" if same_worker else "other_worker"},
    )
    return Refusal(
        DomainError(
            "session_replay_conflict",
            "this session id was registered with different content",
            field="sessionId",
        )
    )


@write_path
def session_register(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    capabilities: CapabilitySnapshot,
    max_concurrent_runs: int,
    available_slots: int,
    software_version: str,
    protocol_version: int,
) -> SessionView | Refusal:
    """Register a process start as a new session, or replay/refuse one (ADR-0012 §2, §3, §6).

    Arguments: ``worker_id`` the authenticated worker; ``session_id`` a worker-generated UUIDv7;
    ``capabilities`` a validated snapshot (``protocol.capabilities.snapshot``);
    ``max_concurrent_runs`` 1–256; ``available_slots`` 0–max; ``software_version`` the agent's
    version string; ``protocol_version`` ≥ 1.

    Semantics: the first session of a worker gets generation 1, version 0. The same session id
    with identical content (capability digest, maximum concurrency, versions) is an exact replay:
    the session's current fence and timers, nothing written — if the session may still act
    (a fenced, offline or lapsed session is refused with its fence code). The same id with
    other content, or another worker's id, is ``session_replay_conflict`` and audited. A new id
    atomically replaces the live session: the old one is fenced and its run leases settled in
    this transaction, and the new one gets generation + 1 and a version above every earlier one.
    A live session whose lease already lapsed is marked ``expired`` instead (nothing to take
    over; not counted as a takeover). More than ``TAKEOVERS_PER_MINUTE`` replacements per worker
    in a minute: 429 ``session_takeover_limited`` (``Retry-After`` = seconds until the oldest
    counted replacement leaves the window), audited, the live session untouched. A worker under
    operator drain registers sessions that start ``draining`` with no capacity. The lease expiry
    is the database clock after the lock plus ``SESSION_LEASE_SECONDS``.

    Locks: the worker row (PostgreSQL ``FOR UPDATE``; SQLite: the IMMEDIATE transaction).
    Writes: session rows; ``session.fenced``/``session.expired``, ``session.registered``,
    ``session.replaced`` events; lease settlement. A unique-key race on insert re-runs the
    transaction (``core.db.UniqueRace``).
    Raises: ``session_id_invalid``, ``validation_failed``, ``slots_exceed_maximum``,
    ``worker_not_found``, ``worker_revoked``, ``session_superseded``/``session_offline``/
    ``session_expired`` (a replay of an ended session), ``session_replay_conflict``,
    ``session_takeover_limited``, ``storage_busy``, ``lock_timeout``.
    """
    if not is_uuid7(session_id):
        raise DomainError("session_id_invalid", "the session id must be a UUIDv7", field="sessionId")
    check_slots(available_slots, max_concurrent_runs)
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    now = db_now()
    digest = registration_sha256(
        capabilities_sha256=capabilities.sha256,
        max_concurrent_runs=max_concurrent_runs,
        software_version=software_version,
        protocol_version=protocol_version,
    )

    existing = WorkerSession.objects.filter(pk=session_id).first()
    if existing is not None:
        return _replay(worker, existing, digest, now)

    replaced = None
    current = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if current is not None and current.lease_expires_at <= now:
        expire_session(current, now=now, actor_type=ActorType.RECONCILER)
    elif current is not None:
        refusal = _takeover_refusal(worker, now)
        if refusal is not None:
            return refusal
        replaced = fence_live_session(
            worker, reason="superseded", now=now, actor_type=ActorType.WORKER, current=current
        )

    # The live session, when there was one, is the newest (and now ended, version bumped).
    latest = current or WorkerSession.objects.filter(worker_id=worker.pk).order_by("-generation").first()
    draining = worker.state == WorkerState.DRAINING
    try:
        session = WorkerSession.objects.create(
            id=session_id,
            worker=worker,
            generation=latest.generation + 1 if latest else 1,
            version=latest.version + 1 if latest else 0,
            state=SessionState.DRAINING if draining else SessionState.ONLINE,
            drained_by="operator" if draining else "",
            capabilities=capabilities.canonical_text,
            capabilities_sha256=capabilities.sha256,
            max_concurrent_runs=max_concurrent_runs,
            available_slots=0 if draining else available_slots,
            software_version=software_version,
            protocol_version=protocol_version,
            registration_sha256=digest,
            registered_at=now,
            lease_expires_at=now + session_lease_ttl(),
        )
    except IntegrityError as exc:
        if is_unique_violation(exc):
            # Another transaction inserted this session id (another worker's registration)
            # after we looked: re-run, which reads its row and answers a conflict.
            raise UniqueRace("session id inserted concurrently") from exc
        raise
    record(
        "session.registered",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation, "replaced": replaced is not None, "draining": draining},
    )
    if replaced is not None:
        record(
            "session.replaced",
            actor_type=ActorType.WORKER,
            worker_id=worker.pk,
            session_id=session.pk,
            data={"generation": session.generation, "previous_generation": replaced.generation},
        )
    return SessionView(session=session, server_time=now, replaced_session=replaced is not None)
