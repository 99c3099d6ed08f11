"""Completion (ADR-0012 §3, docs/leases.md, Completion): both fences in one transaction, lease, attempt,
run and events committed together, an exact replay or a conflict — never a second result."""

from __future__ import annotations

import pytest

from actions.leases.completion import lease_complete
from actions.runs import run_cancel
from audit.models import Event
from core.errors import DomainError
from runs.models import RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, completion, lease_rows, start, starting

pytestmark = pytest.mark.django_db


def running_attempt(**policy):
    session = register(enrolled_worker())
    run = enqueue(make_revision(**policy))
    return start(claim_one(session)), run


def test_completion_commits_lease_attempt_run_and_events_together():
    held, run = running_attempt()
    result = complete(held, stdout="hello\n")
    assert (result.outcome, result.sequence, result.lease_generation) == ("succeeded", 1, 1)
    lease = held.lease()
    assert (lease.state, lease.version, lease.completion_sequence, lease.completion_outcome) == (
        "completed",
        1,
        1,
        "succeeded",
    )
    attempt = held.attempt()
    assert (attempt.state, attempt.exit_code, attempt.stdout_tail) == ("succeeded", 0, "hello\n")
    run.refresh_from_db()
    assert (run.state, run.exit_code) == ("succeeded", 0)
    assert lease.ended_at == attempt.finished_at == run.finished_at
    kinds = list(Event.objects.filter(run_id=run.pk).order_by("id").values_list("kind", flat=True))
    assert kinds[-3:] == ["attempt.succeeded", "run.succeeded", "lease.completed"]


def test_an_identical_resend_is_an_exact_replay_and_anything_else_is_a_409():
    held, _ = running_attempt()
    first = complete(held)
    before = lease_rows()
    assert complete(held) == first
    for other in (dict(outcome="failed", exit_code=1), dict(sequence=2), dict(stdout="different\n")):
        with pytest.raises(DomainError) as refused:
            complete(held, **other)
        assert (refused.value.code, refused.value.status) == ("lease_completed", 409)
    assert lease_rows() == before


@pytest.mark.parametrize(
    ("outcome", "exit_code", "run_state", "error_class"),
    [
        ("failed", 3, "failed", "exit_code"),
        ("timed_out", None, "timed_out", "timeout"),
    ],
)
def test_each_outcome_ends_the_run_when_no_retry_applies(outcome, exit_code, run_state, error_class):
    held, run = running_attempt()
    complete(held, outcome=outcome, exit_code=exit_code)
    run.refresh_from_db()
    assert (run.state, run.exit_code, run.error_class) == (run_state, exit_code, error_class)
    assert held.attempt().state == outcome


def test_a_retryable_outcome_waits_for_attempt_2():
    held, run = running_attempt(max_attempts=3, retry_on=("timed_out",))
    complete(held, outcome="timed_out", exit_code=None)
    run.refresh_from_db()
    assert run.state == "retry_wait" and run.next_attempt_at > held.attempt().finished_at


def test_a_cancel_request_wins_over_a_later_success_and_over_a_retry():
    held, run = running_attempt(max_attempts=3, retry_on=("failed",))
    run_cancel(run_id=run.pk)
    complete(held, outcome="failed", exit_code=1)
    run.refresh_from_db()
    assert (run.state, run.error_class, run.exit_code) == ("cancelled", "cancelled_by_user", 1)
    assert RunAttempt.objects.filter(run=run).count() == 1


def test_a_cancelled_completion_needs_a_cancellation_request():
    """Only an operator's cancellation ends a run ``cancelled``: a worker's own say-so would skip
    the retry policy. Refused with nothing written; once requested, accepted."""
    held, run = running_attempt(max_attempts=3, retry_on=("failed",))
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        complete(held, outcome="cancelled", exit_code=None)
    assert (refused.value.code, refused.value.status, refused.value.field) == (
        "cancel_not_requested",
        409,
        "outcome",
    )
    assert lease_rows() == before
    run_cancel(run_id=run.pk)
    complete(held, outcome="cancelled", exit_code=-15)
    run.refresh_from_db()
    assert (run.state, run.error_class) == ("cancelled", "cancelled_by_user")
    assert held.attempt().state == "cancelled"


def test_completing_before_the_running_ack_is_refused():
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = claim_one(session)
    starting(held)
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        complete(held)
    assert refused.value.code == "attempt_not_started"
    assert lease_rows() == before


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(outcome="succeeded", exit_code=1), "exitCode"),
        (dict(outcome="lost", exit_code=None), "outcome"),
    ],
)
def test_an_impossible_completion_is_refused_naming_the_field(changes, field):
    held, _ = running_attempt()
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        lease_complete(**held.fence(), completion=completion(**changes))
    assert (refused.value.code, refused.value.field) == ("validation_failed", field)
    assert lease_rows() == before
