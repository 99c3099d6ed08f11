"""Lapsed leases: expiry sweeps, lost → retry_wait → queued with attempt N+1, or failed; sessions
that end take their leases with them; a sweep never undoes a renewal or a completion that
landed between its read and its write (ADR-0012 §3 and its "not implemented yet" list)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command

from actions.leases import expiry as lease_expiry
from actions.leases.expiry import lease_expire, sweep_expired_leases
from actions.runs import run_cancel, sweep_due_retries
from actions.sessions.shutdown import session_offline, session_operator_offline
from actions.sweeps import run_cycle
from actions.workers import worker_revoke
from audit import recorder
from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import (
    claim,
    claim_one,
    complete,
    expire_lease,
    lease_rows,
    make_retry_due,
    renew,
    start,
)
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db

TERMINAL_EVENTS = ("run.succeeded", "run.failed", "run.cancelled", "run.timed_out")


@pytest.fixture(autouse=True)
def _any_worker_may_take_a_fresh_attempt(protocol_settings):
    """These tests pick which worker claims a retry; placement's hold for a better-ranked idle
    worker (DISPATCH_HOLD_SECONDS) would otherwise keep a fresh attempt for the lowest worker id."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)


def count(run, *kinds) -> int:
    return Event.objects.filter(run_id=run.pk, kind__in=kinds).count()


def lose(held) -> None:
    """The holder of ``held`` stops answering: its lease lapses and a sweep settles it."""
    expire_lease(held.attempt_id)
    assert sweep_expired_leases() == 1


def test_a_lost_attempt_waits_then_runs_again_as_attempt_2_on_a_fresh_lease():
    a, b = register(enrolled_worker()), register(enrolled_worker())
    run = enqueue(
        make_revision(
            max_attempts=2,
            lost_retry="idempotent",
            retry_backoff_seconds=20,
            retry_backoff_max_seconds=20,
            lost_after_seconds=0,  # the hard deadline is its own test (below)
        )
    )
    first = start(claim_one(a), pid=101)
    lose(first)
    lease = first.lease()
    assert (lease.state, lease.release_reason) == ("released", "lease_expired")
    assert (first.attempt().state, first.attempt().outcome_reason) == ("lost", "lease_expired")
    run.refresh_from_db()
    assert run.state == "retry_wait"
    assert 10 <= (run.next_attempt_at - lease.ended_at).total_seconds() <= 20  # absolute, jittered
    kinds = list(Event.objects.filter(run_id=run.pk).order_by("id").values_list("kind", flat=True))
    assert kinds[-4:] == ["lease.released", "attempt.lost", "run.lost", "run.retry_wait"]
    assert sweep_expired_leases() == 0 and sweep_due_retries() == 0  # not due
    make_retry_due(run.pk)
    assert sweep_due_retries() == 1
    second = claim_one(b)
    attempt = second.attempt()
    assert (attempt.number, second.lease_generation, attempt.worker_id, attempt.pid) == (
        2,
        1,
        b.worker.worker_id,
        None,
    )
    start(second, pid=202)
    complete(second)
    run.refresh_from_db()
    assert (run.state, run.attempt_count) == ("succeeded", 2)


def test_without_a_lost_retry_policy_a_lost_attempt_fails_the_run():
    session = register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=5))  # lost_retry defaults to never
    lose(start(claim_one(session)))
    run.refresh_from_db()
    assert (run.state, run.error_class) == ("failed", "worker_lost")
    assert count(run, *TERMINAL_EVENTS) == 1


def test_two_lost_attempts_of_two_fail_the_run_with_nothing_leased_and_one_terminal_event():
    a, b = register(enrolled_worker()), register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=2, lost_retry="deduplicated"))
    lose(start(claim_one(a)))
    make_retry_due(run.pk)
    assert sweep_due_retries() == 1
    lose(start(claim_one(b)))
    run.refresh_from_db()
    assert (run.state, run.error_class, run.attempt_count) == ("failed", "worker_lost", 2)
    assert list(RunAttempt.objects.filter(run=run).order_by("number").values_list("state", flat=True)) == [
        "lost",
        "lost",
    ]
    assert not RunDispatchLease.objects.filter(run=run, state="leased").exists()
    assert count(run, *TERMINAL_EVENTS) == 1 and count(run, "run.failed") == 1 and count(run, "run.lost") == 2
    assert (run_cycle().retries_queued, RunAttempt.objects.filter(run=run).count()) == (0, 2)


def test_a_worker_paused_past_its_lease_cannot_renew_or_complete_and_the_retry_is_the_only_result():
    paused, other = register(enrolled_worker()), register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=2, lost_retry="idempotent"))
    stale = start(claim_one(paused))
    lose(stale)  # the process stopped (SIGSTOP, a VM pause) long enough for its lease to lapse
    make_retry_due(run.pk)
    sweep_due_retries()
    retry = start(claim_one(other))
    before = lease_rows()
    with pytest.raises(DomainError) as renewing:  # it wakes up and renews with its old token
        renew(stale)
    assert (renewing.value.code, renewing.value.details) == ("lease_released", {"reason": "lease_expired"})
    with pytest.raises(DomainError) as completing:
        complete(stale, stdout="stale result\n")
    assert completing.value.code == "lease_released"
    assert lease_rows() == before
    complete(retry, stdout="retry result\n")
    with pytest.raises(DomainError) as late:  # and once more after the retry finished
        complete(stale, stdout="stale result\n")
    assert late.value.code == "lease_released"
    run.refresh_from_db()
    assert (run.state, run.exit_code) == ("succeeded", 0)
    assert RunAttempt.objects.get(run=run, number=2).stdout_tail == "retry result\n"
    assert RunAttempt.objects.get(run=run, number=1).stdout_tail == ""
    assert count(run, "lease.completed") == 1 and count(run, *TERMINAL_EVENTS) == 1


def test_a_lost_attempt_of_a_cancel_requested_run_is_cancelled_and_never_retried():
    session = register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=3, lost_retry="idempotent"))
    held = start(claim_one(session))
    run_cancel(run_id=run.pk)
    lose(held)
    run.refresh_from_db()
    attempt = held.attempt()
    assert (run.state, run.error_class, run.next_attempt_at) == ("cancelled", "cancelled_by_user", None)
    assert (attempt.state, attempt.outcome_reason) == ("cancelled", "lease_expired")
    assert count(run, "run.lost", "run.retry_wait") == 0
    assert run_cycle().retries_queued == 0
    assert RunAttempt.objects.filter(run=run).count() == 1


# --- a sweep racing a renewal or a completion ------------------------------------------------------


@pytest.fixture
def sweep_with_injected_write(monkeypatch):
    """Run the real sweep, with ``write`` executed between its read and its per-lease write."""

    def run(write):
        real = lease_expire
        observed = []

        def write_lands_first(*, lease_id, observed_version):
            observed.append(observed_version)
            write()
            return real(lease_id=lease_id, observed_version=observed_version)

        monkeypatch.setattr(lease_expiry, "lease_expire", write_lands_first)
        settled = sweep_expired_leases()
        assert observed, "the sweep did not read the lapsed lease"
        return settled

    return run


def _live_again(held) -> None:
    """The competing transaction judged the lease live (just before it lapsed) and commits now:
    give the lease back the expiry it had when that transaction checked it."""
    future = db_now() + timedelta(seconds=30)
    RunDispatchLease.objects.filter(attempt_id=held.attempt_id, state="leased").update(expires_at=future)


def test_a_sweep_racing_a_renewal_changes_nothing(sweep_with_injected_write):
    session = register(enrolled_worker())
    run = enqueue(make_revision())
    held = start(claim_one(session))
    expire_lease(held.attempt_id)

    def renewal():
        _live_again(held)
        renew(held)

    assert sweep_with_injected_write(renewal) == 0
    lease = held.lease()
    assert (lease.state, lease.version, lease.release_reason) == ("leased", 1, "")
    assert held.attempt().state == "running" and Run.objects.get(pk=run.pk).state == "running"
    assert count(run, "lease.released", "attempt.lost", "run.lost") == 0
    complete(held)  # and the worker's result stands
    assert Run.objects.get(pk=run.pk).state == "succeeded"


def test_a_sweep_racing_a_completion_changes_nothing(sweep_with_injected_write):
    session = register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=2, lost_retry="idempotent"))
    held = start(claim_one(session))
    expire_lease(held.attempt_id)

    def completion():
        _live_again(held)
        complete(held, outcome="failed", exit_code=7)

    after_completion = []
    assert sweep_with_injected_write(lambda: (completion(), after_completion.append(lease_rows()))) == 0
    assert lease_rows() == after_completion[0]  # the sweep's write changed nothing at all
    run.refresh_from_db()
    assert (run.state, run.exit_code) == ("failed", 7)  # failed is not in retry_on: no retry
    assert held.attempt().state == "failed" and held.lease().state == "completed"
    assert count(run, "lease.completed") == 1 and count(run, "lease.released", "run.lost") == 0


def test_the_expiry_sweep_works_in_bounded_batches(protocol_settings):
    protocol_settings(SWEEP_BATCH=2)
    session = register(enrolled_worker(), max_concurrent=3)
    revision = make_revision()
    for _ in range(3):
        enqueue(revision)
    for held in claim(session, 3):
        expire_lease(held.attempt_id)
    assert [
        sweep_expired_leases(),
        sweep_expired_leases(),
        sweep_expired_leases(),
    ] == [2, 1, 0]
    assert set(RunDispatchLease.objects.values_list("release_reason", flat=True)) == {"dispatch_timeout"}


def test_the_sweep_command_settles_lapsed_leases(capsys):
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = start(claim_one(session))
    expire_lease(held.attempt_id)
    call_command("sweep")
    assert "leases_settled=1" in capsys.readouterr().out
    assert held.attempt().state == "lost"


# --- sessions that end take their leases with them ------------------------------------------------


@pytest.fixture
def two_leases():
    """One worker session holding a started and an unstarted lease (lost-retry allowed)."""
    worker = enrolled_worker()
    session = register(worker, max_concurrent=2)
    revision = make_revision(max_attempts=2, lost_retry="idempotent")
    started_run, waiting_run = enqueue(revision), enqueue(revision)
    started = start(claim_one(session))
    unstarted = claim_one(session)
    return worker, session, (started, started_run), (unstarted, waiting_run)


def _assert_settled(started, unstarted, reason):
    (held, run), (waiting, waiting_run) = started, unstarted
    assert (held.lease().state, held.lease().release_reason, held.attempt().state) == (
        "released",
        reason,
        "lost",
    )
    assert Run.objects.get(pk=run.pk).state == "retry_wait"
    assert (waiting.lease().state, waiting.lease().release_reason) == ("released", reason)
    assert (waiting.attempt().state, waiting.attempt().session_id) == ("claimed", None)
    assert Run.objects.get(pk=waiting_run.pk).attempt_count == 1


def test_a_replaced_session_settles_its_leases(two_leases):
    worker, _, started, unstarted = two_leases
    register(worker)
    _assert_settled(started, unstarted, "session_replaced")


def test_a_revoked_worker_loses_its_started_attempt_which_is_retried_elsewhere(two_leases):
    worker, _, started, unstarted = two_leases
    worker_revoke(worker_id=worker.worker_id)
    _assert_settled(started, unstarted, "worker_revoked")
    make_retry_due(started[1].pk)
    sweep_due_retries()
    elsewhere = register(enrolled_worker(), max_concurrent=2)
    attempts = {h.attempt().run_id: h.attempt().number for h in claim(elsewhere, 2)}
    assert attempts == {started[1].pk: 2, unstarted[1].pk: 1}


def test_a_forced_offline_session_settles_its_leases(two_leases):
    worker, session, started, unstarted = two_leases
    with pytest.raises(DomainError) as refused:
        session_offline(
            worker_id=worker.worker_id,
            session_id=session.session_id,
            generation=1,
            expected_version=session.version,
        )
    assert refused.value.code == "session_has_active_leases"
    session_operator_offline(worker_id=worker.worker_id, force=True, actor="operator")
    _assert_settled(started, unstarted, "session_offline")


def test_an_expired_session_settles_its_leases(two_leases):
    _, session, started, unstarted = two_leases
    WorkerSession.objects.filter(pk=session.session_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )
    assert run_cycle().sessions_expired == 1
    _assert_settled(started, unstarted, "session_expired")


def test_session_replacement_and_lease_settlement_commit_together(two_leases, monkeypatch):
    worker, session, started, _ = two_leases
    before = lease_rows()
    real = recorder.record

    def crash_on_lost(kind, **kwargs):
        if kind == "attempt.lost":
            raise RuntimeError("crash in the middle of the settlement")
        return real(kind, **kwargs)

    monkeypatch.setattr("runs.transitions.record", crash_on_lost)
    with pytest.raises(RuntimeError):
        register(worker)
    assert lease_rows() == before
    assert WorkerSession.objects.get(pk=session.session_id).state == "online"
