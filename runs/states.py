"""Run and attempt state machines as data (``docs/leases.md``, States).

``RUN_TRANSITIONS[a]`` is the set of states a run may move to from ``a``; likewise for attempts.
``runs.transitions`` is the only code that changes a state, and it consults these tables.
There is no ``waiting_approval`` state: this product has no approvals.
"""

from __future__ import annotations

from django.db import models


class RunState(models.TextChoices):
    CREATED = "created"
    QUEUED = "queued"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    LOST = "lost"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


class AttemptState(models.TextChoices):
    CLAIMED = "claimed"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"


R, A = RunState, AttemptState

RUN_TERMINAL = (R.SUCCEEDED, R.FAILED, R.CANCELLED, R.TIMED_OUT)
ATTEMPT_TERMINAL = (A.SUCCEEDED, A.FAILED, A.CANCELLED, A.TIMED_OUT, A.LOST)
ATTEMPT_LIVE = (A.CLAIMED, A.STARTING, A.RUNNING)
#: A worker accepted the attempt (starting ACK); only a lease lapse or an outcome ends it now.
ATTEMPT_STARTED = (A.STARTING, A.RUNNING)

RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    R.CREATED: frozenset({R.QUEUED, R.CANCELLED}),
    R.QUEUED: frozenset({R.DISPATCHING, R.CANCELLED, R.TIMED_OUT}),
    # An unstarted lease that lapses or is released leaves the run dispatching: the same claimed
    # attempt waits for a new lease generation (docs/leases.md, States, §5 candidates).
    R.DISPATCHING: frozenset({R.RUNNING, R.RETRY_WAIT, R.FAILED, R.CANCELLED, R.TIMED_OUT, R.LOST}),
    R.RUNNING: frozenset({R.RETRY_WAIT, R.SUCCEEDED, R.FAILED, R.CANCELLED, R.TIMED_OUT, R.LOST}),
    R.RETRY_WAIT: frozenset({R.QUEUED, R.CANCELLED, R.TIMED_OUT}),
    # lost is reconciled in the same transaction that marks it (``docs/leases.md``, States).
    R.LOST: frozenset({R.RETRY_WAIT, R.QUEUED, R.FAILED, R.CANCELLED}),
    R.SUCCEEDED: frozenset(),
    R.FAILED: frozenset(),
    R.CANCELLED: frozenset(),
    R.TIMED_OUT: frozenset(),
}

ATTEMPT_TRANSITIONS: dict[str, frozenset[str]] = {
    A.CLAIMED: frozenset({A.STARTING, A.CANCELLED, A.LOST}),
    A.STARTING: frozenset({A.RUNNING, A.FAILED, A.CANCELLED, A.TIMED_OUT, A.LOST}),
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.CANCELLED, A.TIMED_OUT, A.LOST}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.CANCELLED: frozenset(),
    A.TIMED_OUT: frozenset(),
    A.LOST: frozenset(),
}

#: The run state that mirrors an attempt's terminal outcome.
RUN_STATE_FOR_OUTCOME: dict[str, str] = {
    A.SUCCEEDED: R.SUCCEEDED,
    A.FAILED: R.FAILED,
    A.CANCELLED: R.CANCELLED,
    A.TIMED_OUT: R.TIMED_OUT,
}
