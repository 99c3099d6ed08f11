"""How an attempt's end decides its run's next state (``docs/leases.md``: Lost and retry; Cancellation).

Helpers for write paths that already hold the run lock; they open no transaction.

* Cancellation intent wins: once ``cancel_requested_at`` is set, the run ends ``cancelled``
  whatever the attempt reports. A lost attempt of such a run is recorded ``cancelled`` (its
  ``outcome_reason`` keeps why its lease ended) and is never retried (docs/leases.md, Cancellation:
  "lost-retry:
  cancel first").
* ``succeeded`` ends the run ``succeeded``.
* ``failed``/``timed_out`` retry (run → ``retry_wait`` with an absolute next-attempt time) when the
  outcome is in the revision's ``retry_on`` and attempts remain; otherwise the run takes the
  attempt's outcome.
* ``lost``: the run goes ``lost``, then in the same transaction to ``retry_wait`` when the revision
  says a lost attempt is safe to re-run (``lost_retry`` idempotent/deduplicated) and attempts
  remain, else ``failed`` with error class ``worker_lost``. The retry is never due before the
  lost lease's hard deadline — its expiry plus the revision's ``lost_after_seconds``
  (``QINGLONG_LOST_AFTER_SECONDS`` by default), plus ``LOST_RETRY_MARGIN``: an attempt lost because
  its lease lapsed or its session was replaced, revoked or forced offline may still be running on
  a worker that has not heard of it yet (it got no answer), and that worker's guard ends the job
  by the same deadline on its own clock (agent/guard.py; docs/leases.md, Hard deadline). So
  attempt N+1 can never run beside attempt N.

Backoff: ``min(retry_backoff_max_seconds, retry_backoff_seconds · 2^(n−1))`` for attempt n, with
"equal jitter" (a uniform draw from the upper half), so retries of many runs spread out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .models import LostRetry, Run, RunAttempt, TaskRevision
from .states import RUN_STATE_FOR_OUTCOME, AttemptState, RunState
from .transitions import move_attempt, move_run


def retry_delay_seconds(revision: TaskRevision, attempt_number: int) -> float:
    """Jittered backoff before attempt ``attempt_number + 1`` (seconds)."""
    ceiling = min(
        revision.retry_backoff_max_seconds, revision.retry_backoff_seconds * 2 ** (attempt_number - 1)
    )
    return random.uniform(ceiling / 2, ceiling)


def _may_retry(revision: TaskRevision, number: int, outcome: str) -> bool:
    if number >= revision.max_attempts:
        return False
    if outcome == AttemptState.LOST:
        return revision.lost_retry != LostRetry.NEVER
    return outcome in revision.retry_on


@dataclass(frozen=True)
class RunEnd:
    """Where a run goes when its attempt ends with a reported (not ``lost``) outcome: ``state``
    and, for a terminal state, its ``error_class``; ``retry_wait`` has none (a retry is due after
    :func:`retry_delay_seconds`)."""

    state: str
    error_class: str = ""


def run_end(
    revision: TaskRevision, number: int, outcome: str, *, cancel_requested: bool, reason: str = ""
) -> RunEnd:
    """The run's next state when attempt ``number`` of ``revision`` ends with ``outcome`` (succeeded,
    failed, timed_out or cancelled) and the run has (``cancel_requested``) or has not a
    cancellation request; ``reason`` the attempt's outcome reason (``executor_start_failed``).
    A pure rule: :func:`conclude_attempt` applies it, and the completion's PostgreSQL path computes
    it before its one round trip (docs/leases.md, Lost and retry; Cancellation)."""
    if cancel_requested:
        return RunEnd(RunState.CANCELLED, "cancelled_by_user")
    if outcome != AttemptState.SUCCEEDED and _may_retry(revision, number, outcome):
        return RunEnd(RunState.RETRY_WAIT)
    error_classes: dict[str, str] = {
        AttemptState.FAILED: "exit_code",
        AttemptState.TIMED_OUT: "timeout",
        AttemptState.CANCELLED: "cancelled",
    }
    error_class = error_classes.get(outcome, "")
    if reason == "executor_start_failed":
        error_class = "executor_start_error"
    return RunEnd(RUN_STATE_FOR_OUTCOME[outcome], error_class)


def retry_facts(number: int, wait: timedelta) -> dict[str, Any]:
    """The data of a ``run.retry_wait`` event: the attempt that ended and the wait (seconds, 3 places)."""
    return {"attempt": number, "delay_s": round(wait.total_seconds(), 3)}


#: How long after a lost lease's expiry its retry may start at the earliest.
LOST_RETRY_MARGIN = timedelta(seconds=2)


def conclude_attempt(
    run: Run,
    attempt: RunAttempt,
    outcome: str,
    *,
    now: datetime,
    actor_type: str,
    actor: str = "",
    reason: str = "",
    lease_expires_at: datetime | None = None,
    **attempt_fields: Any,
) -> Run:
    """End ``attempt`` with ``outcome`` (a terminal attempt state) and move ``run`` accordingly.

    ``attempt_fields`` are stored on the attempt (exit code, output tails); ``lease_expires_at``
    (for ``lost``) is when the lost lease would have run out: a retry is not due before it plus
    :data:`LOST_RETRY_MARGIN`. Returns the run.
    Precondition: the caller holds the run lock. Raises ``invalid_run_transition`` when the
    attempt or run is not in a state that can end this way.
    """
    if outcome == AttemptState.LOST and run.cancel_requested_at is not None:
        # Cancel first: the run was to stop anyway, so its lost attempt ends cancelled and the
        # run with it, in this transaction; no retry, no `lost` detour.
        move_attempt(
            attempt,
            AttemptState.CANCELLED,
            actor_type=actor_type,
            actor=actor,
            data={"reason": reason or "lost", "lost": True},
            finished_at=now,
            outcome_reason=reason or "lost",
            **attempt_fields,
        )
        return move_run(
            run,
            RunState.CANCELLED,
            actor_type=actor_type,
            actor=actor,
            finished_at=now,
            next_attempt_at=None,
            error_class="cancelled_by_user",
        )
    move_attempt(
        attempt,
        outcome,
        actor_type=actor_type,
        actor=actor,
        data={"reason": reason} if reason else None,
        finished_at=now,
        outcome_reason=reason,
        **attempt_fields,
    )
    revision = run.revision
    exit_code = attempt_fields.get("exit_code")
    if outcome == AttemptState.LOST:
        move_run(run, RunState.LOST, actor_type=actor_type, actor=actor, data={"attempt": attempt.number})
        if _may_retry(revision, attempt.number, outcome):
            not_before = (
                lease_expires_at
                + timedelta(seconds=revision.effective_lost_after_seconds)
                + LOST_RETRY_MARGIN
                if lease_expires_at is not None
                else None
            )
            return _retry_wait(
                run, attempt, now=now, actor_type=actor_type, actor=actor, not_before=not_before
            )
        return move_run(
            run,
            RunState.FAILED,
            actor_type=actor_type,
            actor=actor,
            finished_at=now,
            error_class="worker_lost",
            data={"reason": "worker_lost"},
        )
    end = run_end(
        revision, attempt.number, outcome, cancel_requested=run.cancel_requested_at is not None, reason=reason
    )
    if end.state == RunState.RETRY_WAIT:
        return _retry_wait(run, attempt, now=now, actor_type=actor_type, actor=actor)
    return move_run(
        run,
        end.state,
        actor_type=actor_type,
        actor=actor,
        finished_at=now,
        exit_code=exit_code,
        error_class=end.error_class,
    )


def _retry_wait(
    run: Run,
    attempt: RunAttempt,
    *,
    now: datetime,
    actor_type: str,
    actor: str,
    not_before: datetime | None = None,
) -> Run:
    delay = retry_delay_seconds(run.revision, attempt.number)
    due = now + timedelta(seconds=delay)
    if not_before is not None and due < not_before:
        due = not_before
    return move_run(
        run,
        RunState.RETRY_WAIT,
        actor_type=actor_type,
        actor=actor,
        next_attempt_at=due,
        data=retry_facts(attempt.number, due - now),
    )
