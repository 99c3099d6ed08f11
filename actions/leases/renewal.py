"""Renew and release an existing run lease (ADR-0012 §3; ``docs/leases.md`` Renew and release)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from audit.models import ActorType
from core.conf import protocol
from core.db import call_function, typed_call, write_path
from core.errors import DomainError
from core.wakeups import LISTENING_SQL, worker_and_work
from leases.fence import (
    AckResult,
    check_lease_version,
    fence_lease,
    lease_cas,
    renew_interval,
    require_active,
)
from leases.models import LeaseState, ReleaseReason, lease_from_json
from leases.settlement import settle_lease
from leases.tokens import token_digest
from runs.states import AttemptState
from runs.transitions import update_attempt


def _renew_first(**call: Any) -> AckResult | None:
    """:func:`lease_renew`'s database path (``core.db.write_path``): its arguments, as given."""
    return _in_database(**call, renew_by=timedelta(seconds=protocol().run_lease_seconds))


@write_path(database_path=_renew_first)
def lease_renew(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    lease_version: int,
) -> AckResult:
    """Extend a started attempt's lease (ADR-0012 §3, docs/leases.md, Renew and release).

    Arguments: the session fence, the lease fence and ``lease_version`` (the version the worker
    holds, ≥ 0). Locks worker, then run. Writes: a compare-and-swap on (lease state, version,
    expiry) setting expiry = DB now + ``RUN_LEASE_SECONDS`` and version + 1, and the attempt's
    expiry projection. Answers the new version and expiry and whether the run has a cancellation
    request (the worker then kills the process group and completes ``cancelled``). Renewing an
    unstarted lease is ``attempt_not_started`` (the dispatch timeout bounds that phase); a lapsed
    lease cannot be renewed (``lease_expired``, ``lease_released`` once swept).

    PostgreSQL: one round trip, its own transaction (``ql_lease_release`` with a renewal interval,
    migration leases 0004, as ``core.db.write_path``'s database path); anything but a successful
    renewal is answered by the Python path below.

    Raises: fence codes, ``lease_version_conflict``, ``lease_expired``, ``lease_released``,
    ``lease_completed``, ``attempt_not_started``, ``lock_timeout``.
    """
    run_lease = timedelta(seconds=protocol().run_lease_seconds)
    ctx = fence_lease(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
    )
    lease = ctx.lease
    require_active(lease, ctx.now)
    check_lease_version(lease, lease_version)
    if ctx.attempt.state not in (AttemptState.STARTING, AttemptState.RUNNING):
        raise DomainError("attempt_not_started", "send the starting ACK first", field="attemptId")
    expires = ctx.now + run_lease
    lease_cas(lease, "the renewal", bump=True, expires_at=expires)
    update_attempt(ctx.attempt, lease_expires_at=expires)
    lease.expires_at, lease.version = expires, lease_version + 1
    return AckResult("renewed", lease, ctx.run.cancel_requested_at is not None, renew_interval())


def _release_first(**call: Any) -> AckResult | None:
    """:func:`lease_release`'s database path (``core.db.write_path``): its arguments, as given."""
    return _in_database(**call, renew_by=None)


@write_path(database_path=_release_first)
def lease_release(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    lease_version: int,
) -> AckResult:
    """Hand back an attempt that has not started (ADR-0012 §3); it returns to the queue.

    Arguments: the session fence, the lease fence and ``lease_version``. Locks worker, then run.
    Writes: lease ``released`` (``worker_release``, version + 1), the attempt's projection cleared
    (it stays ``claimed`` under the same number and queue position — a release consumes no try),
    ``lease.released``; if the run has a cancellation request the attempt and run are cancelled
    instead. The next claim of the attempt uses a new lease generation.

    PostgreSQL: one round trip, its own transaction (``ql_lease_release``, migration leases 0004,
    as ``core.db.write_path``'s database path) for a plain release;
    a refusal or a run with a cancellation request is answered by the Python path below.

    Raises: fence codes, ``lease_version_conflict``, ``lease_expired``, ``lease_released``,
    ``lease_completed``, ``attempt_already_started``, ``lock_timeout``.
    """
    ctx = fence_lease(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
    )
    require_active(ctx.lease, ctx.now)
    check_lease_version(ctx.lease, lease_version)
    if ctx.attempt.state != AttemptState.CLAIMED:
        raise DomainError(
            "attempt_already_started", "a started attempt cannot be released", field="attemptId"
        )
    if not settle_lease(
        ctx.lease,
        reason=ReleaseReason.WORKER_RELEASE,
        now=ctx.now,
        actor_type=ActorType.WORKER,
        actor=ctx.worker.name,
        observed_version=lease_version,
    ):
        raise DomainError(
            "lease_version_conflict", "the lease changed under the release", field="leaseVersion"
        )
    ctx.lease.refresh_from_db()
    return AckResult("released", ctx.lease, ctx.run.cancel_requested_at is not None, renew_interval())


_RENEW_SQL = typed_call("ql_lease_release", "uuid, uuid, bigint, uuid, integer, text, integer, interval")
#: A release also reads whether anyone listens: once it has committed, it wakes waiting claims
#: (``core.wakeups``), the worker's own (capacity freed) and those that can run the attempt, back
#: in the queue (its placement class is in the function's answer, leases 0014) — if some process
#: holds waiting claims. The Python path sends its own when it settles.
_RELEASE_SQL = f"{_RENEW_SQL}, {LISTENING_SQL}"


def _in_database(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    lease_version: int,
    renew_by: timedelta | None,
) -> AckResult | None:
    """Release (``renew_by`` None) or renew in one call of ``ql_lease_release``; None: Python answers.

    The function writes only when the call succeeds; on any other case it has written nothing
    and the caller's Python path (its own transaction) answers with its codes.
    """
    digest = token_digest(lease_token, worker_id=worker_id)
    params: list[Any] = [
        worker_id,
        session_id,
        generation,
        attempt_id,
        lease_generation,
        digest,
        lease_version,
        renew_by,
    ]
    if renew_by is None:
        answer, listening = call_function(_RELEASE_SQL, params)
    else:
        (answer,) = call_function(_RENEW_SQL, params)
    if isinstance(answer, str):
        answer = json.loads(answer)
    status = answer["status"]
    if status not in ("released", "renewed"):
        return None
    lease = lease_from_json(answer["lease"])
    lease.version = answer["version"]
    lease.expires_at = datetime.fromisoformat(answer["expires"])
    if status == "released":
        if listening:
            worker_and_work(worker_id, answer["placement"])
        lease.state, lease.release_reason = LeaseState.RELEASED, ReleaseReason.WORKER_RELEASE
        lease.ended_at = datetime.fromisoformat(answer["ended"])
    return AckResult(status, lease, bool(answer["cancel"]), renew_interval())
