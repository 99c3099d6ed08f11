"""Completion: an attempt's result under both fences, in one transaction (ADR-0012 §3; ``docs/leases.md``
Completion)."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

import rfc8785

from audit.models import ActorType
from audit.recorder import record
from core.db import write_path
from core.errors import DomainError
from leases.fence import (
    fence_lease,
    lease_cas,
    require_active,
)
from leases.models import LeaseState
from logs.rules import mask_text
from runs.outcomes import conclude_attempt
from runs.states import AttemptState

OUTCOMES = (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.TIMED_OUT, AttemptState.CANCELLED)


@dataclass(frozen=True)
class Completion:
    """A worker's report of how an attempt ended (tails are bounded UTF-8 text without NUL)."""

    sequence: int
    outcome: str
    exit_code: int | None
    stdout_tail: str = ""
    stderr_tail: str = ""

    def sha256(self) -> str:
        return hashlib.sha256(
            rfc8785.dumps(
                {
                    "sequence": self.sequence,
                    "outcome": self.outcome,
                    "exitCode": self.exit_code,
                    "stdoutTail": self.stdout_tail,
                    "stderrTail": self.stderr_tail,
                }
            )
        ).hexdigest()


@dataclass(frozen=True)
class CompletionResult:
    """The answer to a completion; rebuilt identically from the lease for an exact replay."""

    attempt_id: uuid.UUID
    lease_generation: int
    sequence: int
    outcome: str


@write_path
def lease_complete(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    completion: Completion,
) -> CompletionResult:
    """Record an attempt's result under both fences, in one transaction (ADR-0012 §3, docs/leases.md,
    Completion).

    Arguments: the session fence, the lease fence and a :class:`Completion` (sequence ≥ 1,
    outcome succeeded | failed | timed_out | cancelled, exit code −255…255 or None, output
    tails ≤ 8 KiB each). Locks worker, then run. Checks the session fence and the lease fence
    (token digest, lease generation, session and generation, not released, not expired by the DB
    clock), then writes together: lease ``completed`` (version + 1, completion sequence and
    payload digest), attempt terminal (outcome, exit code, output tails), run state (terminal,
    or ``retry_wait`` per the revision's policy; cancellation intent wins) and their events
    (``attempt.<outcome>``, ``run.<state>``, ``lease.completed``). An identical resend (same
    sequence and payload digest) answers the same result and writes nothing; anything else for
    a completed lease is ``lease_completed`` (409). Never a second result. ``succeeded``
    requires exit code 0; ``cancelled`` requires a cancellation request on the run.

    Raises: ``validation_failed``, fence codes, ``lease_completed``, ``lease_released``,
    ``lease_expired``, ``attempt_not_started``, ``cancel_not_requested``, ``lock_timeout``.
    """
    if completion.outcome not in OUTCOMES:
        raise DomainError("validation_failed", f"must be one of {', '.join(OUTCOMES)}", field="outcome")
    if completion.outcome == AttemptState.SUCCEEDED and completion.exit_code != 0:
        raise DomainError("validation_failed", "a succeeded attempt exits with 0", field="exitCode")
    ctx = fence_lease(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
    )
    lease, attempt, run = ctx.lease, ctx.attempt, ctx.run
    digest = completion.sha256()
    if lease.state == LeaseState.COMPLETED:
        if lease.completion_sequence == completion.sequence and lease.completion_sha256 == digest:
            return CompletionResult(
                attempt.pk, lease.lease_generation, completion.sequence, lease.completion_outcome
            )
        raise DomainError("lease_completed", "the run lease already completed with another result")
    require_active(lease, ctx.now)
    if attempt.state != AttemptState.RUNNING:
        raise DomainError("attempt_not_started", "send the running ACK before completing", field="attemptId")
    if completion.outcome == AttemptState.CANCELLED and run.cancel_requested_at is None:
        # Only an operator's cancellation ends a run cancelled; a worker that stops a job on its
        # own reports failed (or timed_out), and the retry policy decides.
        raise DomainError(
            "cancel_not_requested", "nobody asked to cancel this run; report failed instead", field="outcome"
        )
    lease_cas(
        lease,
        "the completion",
        bump=True,
        state=LeaseState.COMPLETED,
        ended_at=ctx.now,
        completion_sequence=completion.sequence,
        completion_sha256=digest,
        completion_outcome=completion.outcome,
    )
    conclude_attempt(
        run,
        attempt,
        completion.outcome,
        now=ctx.now,
        actor_type=ActorType.WORKER,
        actor=ctx.worker.name,
        exit_code=completion.exit_code,
        # The tails are stored output too: secret env values masked like the log (docs/logs.md).
        stdout_tail=mask_text(completion.stdout_tail, run.revision.env, run.revision.secret_env),
        stderr_tail=mask_text(completion.stderr_tail, run.revision.env, run.revision.secret_env),
    )
    record(
        "lease.completed",
        actor_type=ActorType.WORKER,
        actor=ctx.worker.name,
        worker_id=ctx.worker.pk,
        session_id=ctx.session.pk,
        run_id=run.pk,
        attempt_id=attempt.pk,
        lease_id=lease.pk,
        data={"outcome": completion.outcome, "sequence": completion.sequence},
    )
    return CompletionResult(attempt.pk, lease.lease_generation, completion.sequence, completion.outcome)
