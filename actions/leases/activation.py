"""Activation ACKs: starting, running and start-failed (ADR-0012 §3; ``docs/leases.md`` Activation).

Each locks worker then run (``leases.fence.fence_lease``), checks the offer id and the lease
version the worker holds, and moves the attempt one step in one transaction.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from audit.models import ActorType
from core.conf import protocol
from core.db import call_function, typed_call, write_path
from core.errors import DomainError
from leases.fence import (
    AckResult,
    LeaseFence,
    check_lease_version,
    fence_lease,
    lease_cas,
    renew_interval,
    require_active,
)
from leases.models import LeaseState, lease_from_json
from leases.tokens import token_digest
from runs.outcomes import conclude_attempt
from runs.states import RUN_TRANSITIONS, AttemptState, RunState
from runs.transitions import move_attempt, move_run

from .completion import remember_attempt

MAX_HANDLE = 512


START_FAILURES = {
    "executor_start_failed": AttemptState.FAILED,
    "cancelled": AttemptState.CANCELLED,
    "timed_out": AttemptState.TIMED_OUT,
}


def _fence_ack(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    offer_id: uuid.UUID,
    lease_version: int | None,
) -> LeaseFence:
    """The opening every activation ACK shares: both fences, the offer id the lease was claimed
    with, and — unless ``lease_version`` is None (the start-failure replay check comes first) —
    an active lease at that version."""
    ctx = fence_lease(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
    )
    if ctx.lease.offer_id != offer_id:
        raise DomainError("lease_offer_conflict", "the offer id does not match the lease", field="offerId")
    if lease_version is not None:
        require_active(ctx.lease, ctx.now)
        check_lease_version(ctx.lease, lease_version)
    return ctx


def _starting_first(**call: Any) -> AckResult | None:
    """:func:`lease_starting`'s database path (``core.db.write_path``): its arguments, as given."""
    run_lease = timedelta(seconds=protocol().run_lease_seconds)
    return _ack_in_database(
        **call, step=AttemptState.STARTING, run_lease=run_lease, pid=None, pgid=None, executor_handle=""
    )


@write_path(database_path=_starting_first)
def lease_starting(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    offer_id: uuid.UUID,
    lease_version: int,
) -> AckResult:
    """Starting ACK: the worker accepted the offer (ADR-0012 §3, docs/leases.md, Activation ACKs). Attempt
    claimed → starting.

    Arguments: the session fence, the lease fence (``attempt_id``, ``lease_generation`` ≥ 1,
    ``lease_token``), the ``offer_id`` the lease was claimed with and the ``lease_version`` the
    worker holds. Locks worker, then run. Writes: attempt → ``starting`` (+ ``attempt.starting``,
    its lease-expiry projection), the lease's ``starting_at`` and expiry, moved from the dispatch
    timeout to DB now + run lease TTL; the lease version does not change (only renewals bump it).
    Repeating the ACK answers ``already_starting`` (or ``already_running``) and writes nothing.
    A lease whose dispatch timeout lapsed refuses it (``lease_expired``, or ``lease_released``
    once swept): the timeout's outcome stands. ``cancel_requested`` tells the worker not to start
    (it then sends the ``cancelled`` start failure).

    PostgreSQL: one round trip, its own transaction (``ql_lease_ack``, migration leases 0006, as
    ``core.db.write_path``'s database path) for the ACK that moves the attempt; a refusal or a
    repeated ACK is answered by the Python path below.

    Raises: fence codes, ``lease_offer_conflict``, ``lease_version_conflict``, ``lease_expired``,
    ``lease_released``, ``lease_completed``, ``lock_timeout``.
    """
    run_lease = timedelta(seconds=protocol().run_lease_seconds)
    ctx = _fence_ack(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
        offer_id=offer_id,
        lease_version=lease_version,
    )
    lease, attempt = ctx.lease, ctx.attempt
    cancel = ctx.run.cancel_requested_at is not None
    if attempt.state in (AttemptState.STARTING, AttemptState.RUNNING):
        return AckResult(f"already_{attempt.state}", lease, cancel, renew_interval())
    expires = ctx.now + run_lease
    lease_cas(lease, "the starting ACK", starting_at=ctx.now, expires_at=expires)
    move_attempt(
        attempt,
        AttemptState.STARTING,
        actor_type=ActorType.WORKER,
        actor=ctx.worker.name,
        data={"lease_generation": lease.lease_generation},
        lease_expires_at=expires,
    )
    lease.starting_at, lease.expires_at = ctx.now, expires
    return AckResult("starting", lease, cancel, renew_interval())


def _check_handle(executor_handle: str) -> None:
    if len(executor_handle) > MAX_HANDLE:
        raise DomainError("validation_failed", f"at most {MAX_HANDLE} characters", field="executorHandle")


def _running_first(**call: Any) -> AckResult | None:
    """:func:`lease_running`'s database path (``core.db.write_path``): its arguments, as given."""
    _check_handle(call["executor_handle"])
    return _ack_in_database(**call, step=AttemptState.RUNNING, run_lease=None)


@write_path(database_path=_running_first)
def lease_running(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    offer_id: uuid.UUID,
    lease_version: int,
    pid: int,
    pgid: int | None,
    executor_handle: str,
) -> AckResult:
    """Running ACK: the executor owns a process (ADR-0012 §3, docs/leases.md, Activation ACKs). Attempt and
    run → running.

    Arguments as :func:`lease_starting`, plus ``pid`` (1–2³¹−1), ``pgid`` (the process group the
    worker kills on cancel, or None) and ``executor_handle`` (≤512 characters, e.g.
    ``pid=41 pgid=41 start=…``). Locks worker, then run. Writes: attempt → ``running`` with the
    handle and ``started_at`` = DB time, run → ``running``, the lease's ``running_at``, events
    ``attempt.running`` and ``run.running``. A repeated ACK with the same handle answers
    ``already_running`` and writes nothing; a different handle is ``executor_handle_mismatch``
    (the handle is checked the same way on every later ACK); without a prior starting ACK it is
    ``attempt_not_started``.

    PostgreSQL: one round trip, its own transaction (``ql_lease_ack``, migration leases 0006, as
    ``core.db.write_path``'s database path) for the ACK that moves the attempt and run; a refusal,
    a repeated ACK or a handle to compare is answered by the Python path below.

    Raises: as :func:`lease_starting`, plus ``validation_failed`` (handle too long),
    ``executor_handle_mismatch``, ``attempt_not_started``.
    """
    _check_handle(executor_handle)
    ctx = _fence_ack(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
        offer_id=offer_id,
        lease_version=lease_version,
    )
    lease, attempt, run = ctx.lease, ctx.attempt, ctx.run
    cancel = run.cancel_requested_at is not None
    if attempt.state == AttemptState.RUNNING:
        if (attempt.pid, attempt.pgid, attempt.executor_handle) != (pid, pgid, executor_handle):
            raise DomainError(
                "executor_handle_mismatch", "the attempt runs under another handle", field="executorHandle"
            )
        return AckResult("already_running", lease, cancel, renew_interval())
    if attempt.state != AttemptState.STARTING:
        raise DomainError("attempt_not_started", "send the starting ACK first", field="attemptId")
    lease_cas(lease, "the running ACK", running_at=ctx.now)
    move_attempt(
        attempt,
        AttemptState.RUNNING,
        actor_type=ActorType.WORKER,
        actor=ctx.worker.name,
        started_at=ctx.now,
        pid=pid,
        pgid=pgid,
        executor_handle=executor_handle,
    )
    move_run(
        run,
        RunState.RUNNING,
        actor_type=ActorType.WORKER,
        actor=ctx.worker.name,
        started_at=ctx.now,
        data={"attempt": attempt.number},
    )
    lease.running_at = ctx.now
    return AckResult("running", lease, cancel, renew_interval())


@write_path
def lease_start_failed(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    offer_id: uuid.UUID,
    lease_version: int,
    reason: str,
) -> AckResult:
    """The worker could not (or must not) start the attempt: end it in one transaction (docs/leases.md,
    Activation ACKs).

    Arguments as :func:`lease_starting`, plus ``reason``: ``executor_start_failed`` → failed
    (retried per the revision's ``retry_on``), ``cancelled`` → cancelled (only when the run has a
    cancellation request, which the starting ACK or a heartbeat reported), ``timed_out`` → timed
    out. Allowed from ``starting`` (and from ``claimed`` for ``cancelled``). Locks worker, then
    run. Writes together: lease ``completed`` (version + 1, completion sequence 0), attempt
    terminal, run terminal or ``retry_wait``, their events. A resend after a lost answer (same
    expected version, same reason) replays the answer and writes nothing; anything else on a
    completed lease is ``lease_completed``.

    Raises: as :func:`lease_starting`, plus ``validation_failed`` (reason), ``cancel_not_requested``,
    ``attempt_not_started``/``attempt_already_started``.
    """
    if reason not in START_FAILURES:
        raise DomainError("validation_failed", f"must be one of {', '.join(START_FAILURES)}", field="reason")
    outcome = START_FAILURES[reason]
    ctx = _fence_ack(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
        offer_id=offer_id,
        lease_version=None,
    )
    lease, attempt, run = ctx.lease, ctx.attempt, ctx.run
    if (
        lease.state == LeaseState.COMPLETED
        and lease.completion_sequence == 0
        and lease.completion_outcome == outcome
        and lease.version == lease_version + 1
    ):
        return AckResult("start_failed", lease, run.cancel_requested_at is not None, renew_interval())
    require_active(lease, ctx.now)
    check_lease_version(lease, lease_version)
    if not (
        attempt.state == AttemptState.STARTING
        or (attempt.state == AttemptState.CLAIMED and outcome == AttemptState.CANCELLED)
    ):
        raise DomainError(
            "attempt_already_started" if attempt.state == AttemptState.RUNNING else "attempt_not_started",
            f"a start failure cannot end a {attempt.state} attempt",
            field="attemptId",
        )
    if outcome == AttemptState.CANCELLED and run.cancel_requested_at is None:
        raise DomainError(
            "cancel_not_requested",
            "nobody asked to cancel this run; release the lease instead",
            field="reason",
        )
    lease_cas(
        lease,
        "the start failure",
        bump=True,
        state=LeaseState.COMPLETED,
        ended_at=ctx.now,
        completion_sequence=0,
        completion_outcome=outcome,
    )
    lease.refresh_from_db()
    conclude_attempt(
        run, attempt, outcome, now=ctx.now, actor_type=ActorType.WORKER, actor=ctx.worker.name, reason=reason
    )
    return AckResult("start_failed", lease, run.cancel_requested_at is not None, renew_interval())


_ACK_SQL = typed_call(
    "ql_lease_ack",
    "uuid, uuid, bigint, uuid, integer, text, uuid, integer, text, interval, bigint, bigint, text, text[]",
)
#: The run states the running ACK may move a run from (``runs.states``), handed to ``ql_lease_ack``.
_RUNNING_FROM = sorted(state for state, targets in RUN_TRANSITIONS.items() if RunState.RUNNING in targets)


def _ack_in_database(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    offer_id: uuid.UUID,
    lease_version: int,
    step: str,
    run_lease: timedelta | None,
    pid: int | None,
    pgid: int | None,
    executor_handle: str,
) -> AckResult | None:
    """The starting (``step`` starting, ``run_lease`` the new lease term) or running ACK (``step``
    running, with the process) in one call of ``ql_lease_ack``; None: the Python path answers.

    The function writes only when the ACK moves the attempt; on any other case it has written
    nothing and the caller's Python path (its own transaction) answers with its codes. A success
    also tells this process the attempt's revision and number, which the completion's one round
    trip needs (``actions.leases.completion``).
    """
    params: list[Any] = [
        worker_id,
        session_id,
        generation,
        attempt_id,
        lease_generation,
        token_digest(lease_token, worker_id=worker_id),
        offer_id,
        lease_version,
        str(step),
        run_lease,
        pid,
        pgid,
        executor_handle,
        _RUNNING_FROM,
    ]
    (answer,) = call_function(_ACK_SQL, params)
    if isinstance(answer, str):
        answer = json.loads(answer)
    if answer["status"] != step:
        return None
    remember_attempt(attempt_id, uuid.UUID(answer["revision"]), answer["number"])
    return AckResult(str(step), lease_from_json(answer["lease"]), bool(answer["cancel"]), renew_interval())
