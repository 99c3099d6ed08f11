"""Duplicate and conflicting completions racing on separate connections (docs/leases.md, Completion):
identical resends give one result and identical answers; different results give one winner and
one ``lease_completed`` conflict — never a second result."""

from __future__ import annotations

import pytest

from audit.models import Event
from core.errors import DomainError
from runs.models import Run, RunAttempt
from tests.concurrency.threads import race
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, start

pytestmark = [pytest.mark.django_db(transaction=True)]

TERMINAL_EVENTS = ("run.succeeded", "run.failed", "run.cancelled", "run.timed_out")


@pytest.fixture
def running():
    session = register(enrolled_worker())
    run = enqueue(make_revision())
    return start(claim_one(session)), run


def test_identical_completions_racing_record_one_result_and_answer_alike(running):
    held, run = running
    results = race(*[lambda: complete(held, stdout="same\n")] * 3)
    assert [kind for kind, _ in results] == ["ok"] * 3, results
    assert len({value for _, value in results}) == 1
    assert Event.objects.filter(run_id=run.pk, kind="lease.completed").count() == 1
    assert Event.objects.filter(run_id=run.pk, kind__in=TERMINAL_EVENTS).count() == 1
    assert Run.objects.get(pk=run.pk).state == "succeeded"


def test_conflicting_completions_racing_have_exactly_one_winner(running):
    held, run = running
    results = race(
        lambda: complete(held, outcome="succeeded", exit_code=0),
        lambda: complete(held, outcome="failed", exit_code=9),
    )
    winners = [value for kind, value in results if kind == "ok"]
    losers = [value for kind, value in results if kind == "error"]
    assert len(winners) == 1 and len(losers) == 1, results
    assert isinstance(losers[0], DomainError) and losers[0].code == "lease_completed"
    run.refresh_from_db()
    assert run.state == winners[0].outcome
    assert RunAttempt.objects.get(run=run).state == winners[0].outcome
    assert Event.objects.filter(run_id=run.pk, kind="lease.completed").count() == 1
    assert Event.objects.filter(run_id=run.pk, kind__in=TERMINAL_EVENTS).count() == 1


@pytest.mark.parametrize("round_", range(20))
def test_a_completion_racing_a_session_replacement_lands_before_it_or_is_fenced(round_):
    """The old process completes while a new process of the same worker registers (ADR-0012 §2,
    §3): both lock the worker row, so either the result stands and the replacement finds no live
    lease, or the replacement settles the attempt lost and the completion is refused — never
    both, never a second result."""
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(make_revision(max_attempts=2, lost_retry="idempotent"))
    held = start(claim_one(session))
    results = race(lambda: complete(held), lambda: register(worker))
    completion, replacement = results
    assert replacement[0] == "ok", replacement  # a new process is never refused for this
    run.refresh_from_db()
    attempt = RunAttempt.objects.get(run=run, number=1)
    if completion[0] == "ok":
        assert (run.state, attempt.state) == ("succeeded", "succeeded")
        assert not Event.objects.filter(run_id=run.pk, kind="attempt.lost").exists()
    else:
        error = completion[1]
        assert isinstance(error, DomainError) and error.code in ("session_superseded", "lease_released"), (
            error
        )
        assert attempt.state == "lost" and run.state == "retry_wait"
        assert not Event.objects.filter(run_id=run.pk, kind="lease.completed").exists()
    assert Event.objects.filter(run_id=run.pk, kind__in=TERMINAL_EVENTS).count() == (completion[0] == "ok")
