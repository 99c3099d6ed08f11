"""The run and attempt state machines: the tables match docs/leases.md, Statesone service enforces them,
and the database refuses rows that break them even when a write bypasses the services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction

from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol.ids import uuid7
from runs.models import Run, RunAttempt
from runs.states import (
    ATTEMPT_TERMINAL,
    ATTEMPT_TRANSITIONS,
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    AttemptState,
    RunState,
)
from runs.transitions import move_attempt, move_run
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, start

pytestmark = pytest.mark.django_db

# docs/leases.md, States (without waiting_approval which this product has no use for), plus
# dispatching→timed_out [0013] and lost→retry_wait [0021 §5.5].
EXPECTED_RUN = {
    "created": {"queued", "cancelled"},
    "queued": {"dispatching", "cancelled", "timed_out"},
    "dispatching": {"running", "retry_wait", "failed", "cancelled", "lost", "timed_out"},
    "running": {"retry_wait", "succeeded", "failed", "cancelled", "timed_out", "lost"},
    "retry_wait": {"queued", "cancelled", "timed_out"},
    "lost": {"queued", "failed", "cancelled", "retry_wait"},
    "succeeded": set(),
    "failed": set(),
    "cancelled": set(),
    "timed_out": set(),
}
EXPECTED_ATTEMPT = {
    "claimed": {"starting", "cancelled", "lost"},
    "starting": {"running", "failed", "cancelled", "timed_out", "lost"},
    "running": {"succeeded", "failed", "cancelled", "timed_out", "lost"},
    "succeeded": set(),
    "failed": set(),
    "cancelled": set(),
    "timed_out": set(),
    "lost": set(),
}


def test_transition_tables_are_the_sibling_records_tables():
    assert {k: set(v) for k, v in RUN_TRANSITIONS.items()} == EXPECTED_RUN
    assert {k: set(v) for k, v in ATTEMPT_TRANSITIONS.items()} == EXPECTED_ATTEMPT
    assert set(RUN_TRANSITIONS) == set(RunState.values)
    assert set(ATTEMPT_TRANSITIONS) == set(AttemptState.values)
    assert all(not RUN_TRANSITIONS[s] for s in RUN_TERMINAL)
    assert all(not ATTEMPT_TRANSITIONS[s] for s in ATTEMPT_TERMINAL)


def test_a_forbidden_run_move_is_refused_and_writes_nothing():
    run = enqueue(make_revision())
    run = Run.objects.get(pk=run.pk)
    events = Event.objects.count()
    with pytest.raises(DomainError) as refused, transaction.atomic():
        move_run(run, RunState.SUCCEEDED, actor_type="system", finished_at=db_now())
    assert refused.value.code == "invalid_run_transition"
    assert Run.objects.get(pk=run.pk).state == "queued"
    assert Event.objects.count() == events


def test_a_stale_run_version_is_a_conflict_not_a_silent_retry():
    run = Run.objects.get(pk=enqueue(make_revision()).pk)
    Run.objects.filter(pk=run.pk).update(version=run.version + 1)  # another transaction moved it
    with pytest.raises(DomainError) as refused, transaction.atomic():
        move_run(run, RunState.CANCELLED, actor_type="system", finished_at=db_now())
    assert refused.value.code == "run_version_conflict"
    assert Run.objects.get(pk=run.pk).state == "queued"


def test_a_forbidden_attempt_move_is_refused():
    attempt = RunAttempt.objects.get(run=enqueue(make_revision()))
    with pytest.raises(DomainError) as refused, transaction.atomic():
        move_attempt(attempt, AttemptState.SUCCEEDED, actor_type="system", finished_at=db_now())
    assert refused.value.code == "invalid_run_transition"


@pytest.fixture
def finished():
    """A run that went through a real lease to succeeded, and its attempt and lease."""
    session = register(enrolled_worker())
    run = enqueue(make_revision())
    held = start(claim_one(session))
    complete(held)
    return Run.objects.get(pk=run.pk), held.attempt(), held.lease()


def _refused(queryset, **values) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        queryset.update(**values)


def test_database_refuses_run_rows_that_break_the_machine(finished):
    run, _, _ = finished
    rows = Run.objects.filter(pk=run.pk)
    now = db_now()
    _refused(rows, state="bogus")
    _refused(rows, finished_at=None)  # a terminal run has an end
    _refused(rows, state="running", started_at=None, finished_at=None)  # running has a start
    _refused(rows, state="retry_wait", next_attempt_at=None, finished_at=None)
    _refused(rows, next_attempt_at=now)  # only a waiting run has a next-attempt time
    _refused(rows, state="queued")  # a live run has no end
    _refused(rows, state="queued", finished_at=None, attempt_count=0)
    queued = Run.objects.filter(pk=enqueue(make_revision()).pk)
    _refused(queued, state="succeeded")  # terminal without an end


def test_database_refuses_attempt_rows_that_break_the_machine(finished):
    run, attempt, _ = finished
    rows = RunAttempt.objects.filter(pk=attempt.pk)
    _refused(rows, state="bogus")
    _refused(rows, finished_at=None)
    _refused(rows, state="running", finished_at=None, pid=None)  # running needs the process
    pending = RunAttempt.objects.filter(run=enqueue(make_revision()))
    _refused(pending, state="starting")  # nobody holds a lease on it
    _refused(pending, finished_at=db_now())  # a live attempt has no end
    # one live attempt per run, ever
    live = pending.get()
    with pytest.raises(IntegrityError) as broken, transaction.atomic():
        RunAttempt.objects.create(run=live.run, number=2, ready_at=live.ready_at, created_at=live.created_at)
    # PostgreSQL names the index, SQLite the column it covers
    assert {"one_live_attempt_per_run", "runs_runattempt.run_id"} & set(
        str(broken.value).replace('"', " ").split()
    )


def test_database_refuses_lease_rows_that_break_the_machine(finished):
    _, _, lease = finished
    rows = RunDispatchLease.objects.filter(pk=lease.pk)
    _refused(rows, completion_outcome="")  # completed needs sequence AND outcome
    _refused(rows, completion_sequence=None)
    _refused(rows, state="leased")  # an active lease has no end
    _refused(rows, state="released")  # released needs a reason, and carries no completion
    _refused(rows, release_reason="lease_expired")  # only a released lease has a reason
    _refused(
        rows,
        state="released",
        release_reason="because",
        completion_sequence=None,
        completion_outcome="",
        completion_sha256="",
    )
    _refused(rows, starting_at=None)  # running_at without starting_at


def test_database_refuses_a_second_active_lease_for_one_attempt():
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = claim_one(session)
    lease = held.lease()
    with pytest.raises(IntegrityError) as broken, transaction.atomic():
        RunDispatchLease.objects.create(
            attempt_id=lease.attempt_id,
            run_id=lease.run_id,
            worker_id=lease.worker_id,
            session_id=lease.session_id,
            session_generation=1,
            lease_generation=2,
            offer_id=uuid7(),
            token_digest="0" * 64,
            expires_at=lease.expires_at + timedelta(seconds=5),
            spec_sha256=lease.spec_sha256,
            claimed_at=lease.claimed_at,
        )
    assert {"one_active_lease_per_attempt", "leases_rundispatchlease.attempt_id"} & set(
        str(broken.value).replace('"', " ").split()
    )
