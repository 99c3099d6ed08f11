"""Activation ACKs, renew and release (ADR-0012 §3; docs/leases.md, Activation ACKs).

Claim ≠ starting ≠ running."""

from __future__ import annotations

import pytest

from actions.leases.activation import lease_start_failed, lease_starting
from actions.leases.expiry import sweep_expired_leases
from actions.leases.renewal import lease_renew
from actions.runs import run_cancel
from core.errors import DomainError
from protocol.ids import uuid7
from runs.models import Run, RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, expire_lease, lease_rows, release, renew, running, start, starting

pytestmark = pytest.mark.django_db


@pytest.fixture
def held(protocol_settings):
    protocol_settings(RUN_LEASE_SECONDS=40, DISPATCH_TIMEOUT_SECONDS=20)
    session = register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=2, retry_on=("failed",)))
    return claim_one(session), run


def test_starting_moves_the_attempt_and_the_lease_expiry_but_not_the_version(held):
    held, run = held
    answer = starting(held)
    assert (answer.status, answer.cancel_requested, answer.lease.version) == ("starting", False, 0)
    lease = held.lease()
    assert (lease.expires_at - lease.starting_at).total_seconds() == pytest.approx(40)
    attempt = held.attempt()
    assert (attempt.state, attempt.lease_expires_at) == ("starting", lease.expires_at)
    assert Run.objects.get(pk=run.pk).state == "dispatching"
    before = lease_rows()
    assert starting(held).status == "already_starting"
    assert lease_rows() == before


def test_running_records_the_handle_and_a_different_handle_is_refused(held):
    held, run = held
    starting(held)
    answer = running(held, pid=777)
    assert answer.status == "running"
    attempt = held.attempt()
    assert (attempt.state, attempt.pid, attempt.pgid, attempt.executor_handle) == (
        "running",
        777,
        777,
        "pid=777 pgid=777",
    )
    assert Run.objects.get(pk=run.pk).state == "running"
    assert attempt.started_at == held.lease().running_at
    before = lease_rows()
    assert running(held, pid=777).status == "already_running"
    with pytest.raises(DomainError) as refused:
        running(held, pid=778)
    assert (refused.value.code, refused.value.field) == ("executor_handle_mismatch", "executorHandle")
    assert starting(held).status == "already_running"
    assert lease_rows() == before


def test_running_without_starting_is_refused(held):
    held, _ = held
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        running(held)
    assert refused.value.code == "attempt_not_started"
    assert lease_rows() == before


def test_an_ack_with_a_stale_lease_version_or_another_offer_id_is_refused(held):
    held, _ = held
    before = lease_rows()
    with pytest.raises(DomainError) as stale:
        lease_starting(**held.fence(), offer_id=held.ticket.offer_id, lease_version=1)
    assert (stale.value.code, stale.value.details) == ("lease_version_conflict", {"currentVersion": 0})
    with pytest.raises(DomainError) as other:
        lease_starting(**held.fence(), offer_id=uuid7(), lease_version=0)
    assert (other.value.code, other.value.field) == ("lease_offer_conflict", "offerId")
    assert lease_rows() == before


def test_dispatch_timeout_returns_the_attempt_to_the_queue_without_consuming_a_try(held):
    held, run = held
    expire_lease(held.attempt_id)
    with pytest.raises(DomainError) as late:  # before any sweep: the lease already lapsed
        starting(held)
    assert late.value.code == "lease_expired"
    assert sweep_expired_leases() == 1
    lease = held.lease()
    assert (lease.state, lease.release_reason) == ("released", "dispatch_timeout")
    attempt = held.attempt()
    assert (attempt.state, attempt.number, attempt.lease_expires_at, attempt.session_id) == (
        "claimed",
        1,
        None,
        None,
    )
    run.refresh_from_db()
    assert (run.state, run.attempt_count) == ("dispatching", 1)
    before = lease_rows()
    with pytest.raises(DomainError) as after:  # the timeout's outcome stands
        starting(held)
    assert (after.value.code, after.value.details) == ("lease_released", {"reason": "dispatch_timeout"})
    assert lease_rows() == before


def test_start_failure_ends_the_attempt_and_retries_per_policy_and_replays_exactly(held):
    held, run = held
    starting(held)
    answer = lease_start_failed(
        **held.fence(), offer_id=held.ticket.offer_id, lease_version=0, reason="executor_start_failed"
    )
    assert answer.status == "start_failed"
    lease = held.lease()
    assert (lease.state, lease.version, lease.completion_outcome) == ("completed", 1, "failed")
    assert held.attempt().state == "failed" and held.attempt().outcome_reason == "executor_start_failed"
    assert Run.objects.get(pk=run.pk).state == "retry_wait"
    before = lease_rows()
    again = lease_start_failed(
        **held.fence(), offer_id=held.ticket.offer_id, lease_version=0, reason="executor_start_failed"
    )
    assert again.status == "start_failed"
    with pytest.raises(DomainError) as other:
        lease_start_failed(**held.fence(), offer_id=held.ticket.offer_id, lease_version=0, reason="timed_out")
    assert other.value.code == "lease_completed"
    assert lease_rows() == before


def test_a_cancelled_start_failure_needs_a_cancel_request(held):
    held, run = held
    starting(held)
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        lease_start_failed(**held.fence(), offer_id=held.ticket.offer_id, lease_version=0, reason="cancelled")
    assert (refused.value.code, refused.value.field) == ("cancel_not_requested", "reason")
    assert lease_rows() == before
    run_cancel(run_id=run.pk)
    assert starting(held).cancel_requested is True
    lease_start_failed(**held.fence(), offer_id=held.ticket.offer_id, lease_version=0, reason="cancelled")
    run.refresh_from_db()
    assert (run.state, held.attempt().state, held.lease().state) == ("cancelled", "cancelled", "completed")


def test_start_failure_after_running_is_refused(held):
    held, _ = held
    start(held)
    with pytest.raises(DomainError) as refused:
        lease_start_failed(
            **held.fence(), offer_id=held.ticket.offer_id, lease_version=0, reason="executor_start_failed"
        )
    assert refused.value.code == "attempt_already_started"


def test_renew_is_a_cas_on_the_version_and_extends_by_the_database_clock(held):
    held, _ = held
    start(held)
    first = renew(held)
    assert (first.status, first.lease.version) == ("renewed", 1)
    lease = held.lease()
    assert lease.version == 1 and held.attempt().lease_expires_at == lease.expires_at
    before = lease_rows()
    with pytest.raises(DomainError) as stale:
        lease_renew(**held.fence(), lease_version=0)
    assert (stale.value.code, stale.value.details) == ("lease_version_conflict", {"currentVersion": 1})
    assert lease_rows() == before
    assert renew(held).lease.version == 2


def test_renewing_an_unstarted_or_lapsed_lease_is_refused(held):
    held, _ = held
    with pytest.raises(DomainError) as unstarted:
        renew(held)
    assert unstarted.value.code == "attempt_not_started"
    start(held)
    expire_lease(held.attempt_id)
    before = lease_rows()
    with pytest.raises(DomainError) as lapsed:
        renew(held)
    assert lapsed.value.code == "lease_expired"
    assert lease_rows() == before


def test_renew_answers_a_cancellation_request(held):
    held, run = held
    start(held)
    assert renew(held).cancel_requested is False
    run_cancel(run_id=run.pk)
    assert renew(held).cancel_requested is True
    assert Run.objects.get(pk=run.pk).state == "running"  # the worker stops it and completes cancelled


def test_release_hands_back_an_unstarted_attempt_and_a_started_one_cannot(held):
    held, run = held
    answer = release(held)
    assert answer.status == "released" and answer.lease.state == "released"
    assert (held.lease().release_reason, held.lease().version) == ("worker_release", 1)
    assert (held.attempt().state, held.attempt().number, held.attempt().session_id) == ("claimed", 1, None)
    again = claim_one(held.session)
    assert (again.attempt_id, again.lease_generation) == (held.attempt_id, 2)
    start(again)
    with pytest.raises(DomainError) as started:
        release(again)
    assert started.value.code == "attempt_already_started"


def test_releasing_a_cancel_requested_attempt_cancels_it(held):
    held, run = held
    run_cancel(run_id=run.pk)
    release(held)
    run.refresh_from_db()
    assert (run.state, held.attempt().state) == ("cancelled", "cancelled")
    assert RunAttempt.objects.filter(run=run).count() == 1
