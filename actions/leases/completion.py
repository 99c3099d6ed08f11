"""Completion: an attempt's result under both fences, in one transaction (ADR-0012 §3; ``docs/leases.md``
Completion)."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import rfc8785
from psycopg.types.json import Jsonb

from audit.models import ActorType
from audit.recorder import record
from core.db import call_function, typed_call, write_path
from core.errors import DomainError
from core.wakeups import LISTENING_SQL, worker_changed
from leases.fence import (
    fence_lease,
    lease_cas,
    require_active,
)
from leases.models import LeaseState
from leases.tokens import token_digest
from logs.rules import mask_text
from runs.models import TaskRevision
from runs.outcomes import conclude_attempt, retry_delay_seconds, retry_facts, run_end
from runs.states import ATTEMPT_TRANSITIONS, RUN_TRANSITIONS, AttemptState, RunState

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


def check_completion(completion: Completion) -> None:
    """Refuse (``validation_failed`` naming ``outcome`` or ``exitCode``) a report no attempt can end with."""
    if completion.outcome not in OUTCOMES:
        raise DomainError("validation_failed", f"must be one of {', '.join(OUTCOMES)}", field="outcome")
    if completion.outcome == AttemptState.SUCCEEDED and completion.exit_code != 0:
        raise DomainError("validation_failed", "a succeeded attempt exits with 0", field="exitCode")


def _complete_first(**call: Any) -> CompletionResult | None:
    """:func:`lease_complete`'s database path (``core.db.write_path``): its arguments, as given."""
    check_completion(call["completion"])
    return _complete_in_database(**call)


@write_path(database_path=_complete_first)
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

    PostgreSQL: one round trip that is its own transaction (``ql_lease_complete``, migration leases
    0007 and 0010, as ``core.db.write_path``'s database path) once this process
    knows the attempt's revision and number (its running ACK tells it; otherwise the function
    answers them and the call is repeated); the policy — masking, digest, retry decision and
    wait — is computed here before the call. A refusal or a replay is answered by the Python path
    below.

    Raises: ``validation_failed``, fence codes, ``lease_completed``, ``lease_released``,
    ``lease_expired``, ``attempt_not_started``, ``cancel_not_requested``, ``lock_timeout``.
    """
    check_completion(completion)
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


# --- PostgreSQL: the completion in one round trip -------------------------------------------------
#
# The plan needs the attempt's pinned revision (retry policy, secret env) and its number; neither
# ever changes for an attempt id, so this process remembers them from the attempt's running ACK
# (``actions.leases.activation``) and keeps the revisions it has read. The function checks both.

_CACHE_LIMIT = 4096
#: {attempt id: (its revision id, its number)}, from running ACKs and ``learn`` answers.
_attempts: dict[uuid.UUID, tuple[uuid.UUID, int]] = {}
#: {revision id: the revision}; a pinned revision is immutable.
_revisions: dict[uuid.UUID, TaskRevision] = {}

#: ``ql_lease_complete``'s argument types (``next_claim`` calls it inside its claim's function too).
COMPLETE_TYPES = (
    "uuid, uuid, bigint, uuid, integer, text, uuid, integer, integer, text, integer, text, text, text, "
    "text[], text[], text[], interval[], jsonb"
)
#: The completion, and whether any process holds waiting claims to wake (``core.wakeups``).
_COMPLETE_SQL = typed_call("ql_lease_complete", COMPLETE_TYPES) + f", {LISTENING_SQL}"


def remember_attempt(attempt_id: uuid.UUID, revision_id: uuid.UUID, number: int) -> None:
    """Note an attempt's revision and number (from a call that read them under the run lock)."""
    if len(_attempts) >= _CACHE_LIMIT:
        _attempts.clear()
    _attempts[attempt_id] = (revision_id, number)


def _revision(revision_id: uuid.UUID) -> TaskRevision:
    revision = _revisions.get(revision_id)
    if revision is None:
        revision = TaskRevision.objects.get(pk=revision_id)
        if len(_revisions) >= _CACHE_LIMIT:
            _revisions.clear()
        _revisions[revision_id] = revision
    return revision


def _plan(revision: TaskRevision, number: int, completion: Completion) -> list[Any]:
    """The policy part of ``ql_lease_complete``'s arguments for attempt ``number`` of ``revision``:
    masked tails, then the run's move per case (no cancellation request, one) as
    ``runs.outcomes.conclude_attempt`` would make it, and the run states it may move from."""
    outcome = completion.outcome
    states: list[str | None] = []
    errors: list[str] = []
    waits: list[timedelta | None] = []
    data: list[dict[str, Any]] = []
    for cancel_requested in (False, True):
        if outcome == AttemptState.CANCELLED and not cancel_requested:
            states.append(None)  # cancel_not_requested: the Python path answers
            errors.append("")
            waits.append(None)
            data.append({})
            continue
        end = run_end(revision, number, outcome, cancel_requested=cancel_requested)
        states.append(end.state)
        errors.append(end.error_class)
        if end.state == RunState.RETRY_WAIT:
            wait = timedelta(seconds=retry_delay_seconds(revision, number))
            waits.append(wait)
            data.append(retry_facts(number, wait))
        else:
            waits.append(None)
            data.append({})
    targets = {state for state in states if state is not None}
    run_from = sorted(state for state, allowed in RUN_TRANSITIONS.items() if targets <= allowed)
    if outcome not in ATTEMPT_TRANSITIONS[AttemptState.RUNNING]:
        run_from = []  # the Python path answers
    return [
        mask_text(completion.stdout_tail, revision.env, revision.secret_env),
        mask_text(completion.stderr_tail, revision.env, revision.secret_env),
        run_from,
        states,
        errors,
        waits,
        Jsonb(data),
    ]


def complete_params(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    completion: Completion,
    known: tuple[uuid.UUID, int] | None,
) -> list[Any]:
    """``ql_lease_complete``'s arguments (:data:`COMPLETE_TYPES`' order) for ``known``, the
    attempt's (revision id, number) as this process believes them; None: ask the function
    (it answers ``learn`` with them, writing nothing)."""
    if known is None:
        plan: list[Any] = ["", "", [], [], [], [], Jsonb([])]  # answered by ``learn``
    else:
        plan = _plan(_revision(known[0]), known[1], completion)
    return [
        worker_id,
        session_id,
        generation,
        attempt_id,
        lease_generation,
        token_digest(lease_token, worker_id=worker_id),
        known[0] if known is not None else None,
        known[1] if known is not None else None,
        completion.sequence,
        completion.outcome,
        completion.exit_code,
        completion.sha256(),
        *plan,
    ]


def known_attempt(attempt_id: uuid.UUID) -> tuple[uuid.UUID, int] | None:
    """The (revision id, number) this process has noted for ``attempt_id`` (:func:`remember_attempt`)."""
    return _attempts.get(attempt_id)


def completed_in_database(worker_id: uuid.UUID, attempt_id: uuid.UUID, listening: bool) -> None:
    """After ``ql_lease_complete`` completed ``attempt_id`` (committed): forget its revision and,
    when ``listening`` (some process holds waiting claims), wake the worker's waiting requests."""
    _attempts.pop(attempt_id, None)
    if listening:
        worker_changed(worker_id)  # capacity freed: the worker's waiting requests answer it


def _complete_in_database(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    completion: Completion,
) -> CompletionResult | None:
    """The completion through ``ql_lease_complete``; None: the Python path answers (nothing written).

    One statement, its own transaction (``core.db.write_path``). Without the attempt's revision and number the
    first call only learns them (``learn``); at most two calls, then the Python path.
    """
    known = _attempts.get(attempt_id)
    for _ in range(2):
        params = complete_params(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            attempt_id=attempt_id,
            lease_generation=lease_generation,
            lease_token=lease_token,
            completion=completion,
            known=known,
        )
        answer, listening = call_function(_COMPLETE_SQL, params)
        if isinstance(answer, str):
            answer = json.loads(answer)
        if answer["status"] == "completed":
            completed_in_database(worker_id, attempt_id, listening)
            return CompletionResult(attempt_id, lease_generation, completion.sequence, completion.outcome)
        if answer["status"] != "learn":
            return None
        known = (uuid.UUID(answer["revision"]), answer["number"])
        remember_attempt(attempt_id, *known)
    return None
