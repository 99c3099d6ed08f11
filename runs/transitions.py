"""The one place run and attempt states change (docs/leases.md, States — transaction rule).

Each move is validated against the tables in ``runs.states``, written as a compare-and-swap on
the row's version, and appends its event in the same transaction: ``run.<state>`` carries the
run's new ``event_sequence``. Callers are write paths that already hold the run's row lock
(``runs.locks``); a CAS miss therefore means a bug or a lock-order violation, and it aborts the
whole transaction with ``run_version_conflict`` rather than retrying silently.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F

from audit.recorder import record
from core.errors import DomainError

from .models import Run, RunAttempt
from .states import ATTEMPT_TRANSITIONS, RUN_TRANSITIONS, RunState

#: States in which a run waits for a worker; only they carry a placement summary.
WAITING = (RunState.QUEUED, RunState.DISPATCHING)


def move_run(
    run: Run,
    to: str,
    *,
    actor_type: str,
    actor: str = "",
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> Run:
    """Move ``run`` to state ``to`` (also setting ``fields``), bump version and event sequence.

    Leaving the waiting states (queued, dispatching) clears the run's placement summary. Raises
    ``invalid_run_transition`` if the table forbids it, ``run_version_conflict`` if the row
    changed since it was read. Updates ``run`` in place and returns it.
    """
    if to not in RUN_TRANSITIONS[run.state]:
        raise DomainError("invalid_run_transition", f"a run cannot move from {run.state} to {to}")
    if to not in WAITING and run.placement_summary is not None:
        fields.setdefault("placement_summary", None)  # "why it waits" describes waiting runs only
    changed = Run.objects.filter(pk=run.pk, version=run.version, state=run.state).update(
        state=to, version=F("version") + 1, event_sequence=F("event_sequence") + 1, **fields
    )
    if changed != 1:
        raise DomainError("run_version_conflict", "the run changed under this transaction")
    run.state = to
    run.version += 1
    run.event_sequence += 1
    for name, value in fields.items():
        setattr(run, name, value)
    record(
        f"run.{to}",
        actor_type=actor_type,
        actor=actor,
        run_id=run.pk,
        run_sequence=run.event_sequence,
        data=data,
    )
    return run


def bump_run(
    run: Run,
    kind: str,
    *,
    actor_type: str,
    actor: str = "",
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> Run:
    """Record a run fact that is not a state change (``run.cancel_requested``, ``run.dispatching``
    again for a new lease): CAS on version, bump version and sequence, append ``kind``."""
    changed = Run.objects.filter(pk=run.pk, version=run.version).update(
        version=F("version") + 1, event_sequence=F("event_sequence") + 1, **fields
    )
    if changed != 1:
        raise DomainError("run_version_conflict", "the run changed under this transaction")
    run.version += 1
    run.event_sequence += 1
    for name, value in fields.items():
        setattr(run, name, value)
    record(
        kind, actor_type=actor_type, actor=actor, run_id=run.pk, run_sequence=run.event_sequence, data=data
    )
    return run


def move_attempt(
    attempt: RunAttempt,
    to: str,
    *,
    actor_type: str,
    actor: str = "",
    worker_id: Any = None,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> RunAttempt:
    """Move ``attempt`` to ``to`` with a CAS on (state, version); append ``attempt.<to>``.

    Raises ``invalid_run_transition`` or ``run_version_conflict`` as :func:`move_run` does.
    """
    if to not in ATTEMPT_TRANSITIONS[attempt.state]:
        raise DomainError("invalid_run_transition", f"an attempt cannot move from {attempt.state} to {to}")
    changed = RunAttempt.objects.filter(pk=attempt.pk, version=attempt.version, state=attempt.state).update(
        state=to, version=F("version") + 1, **fields
    )
    if changed != 1:
        raise DomainError("run_version_conflict", "the attempt changed under this transaction")
    attempt.state = to
    attempt.version += 1
    for name, value in fields.items():
        setattr(attempt, name, value)
    record(
        f"attempt.{to}",
        actor_type=actor_type,
        actor=actor,
        worker_id=worker_id or attempt.worker_id,
        run_id=attempt.run_id,
        attempt_id=attempt.pk,
        data={"number": attempt.number, **(data or {})},
    )
    return attempt


def update_attempt(attempt: RunAttempt, **fields: Any) -> RunAttempt:
    """CAS-update non-state fields of an attempt (its lease projection), bumping its version."""
    changed = RunAttempt.objects.filter(pk=attempt.pk, version=attempt.version, state=attempt.state).update(
        version=F("version") + 1, **fields
    )
    if changed != 1:
        raise DomainError("run_version_conflict", "the attempt changed under this transaction")
    attempt.version += 1
    for name, value in fields.items():
        setattr(attempt, name, value)
    return attempt
