"""Attempt N+1 never runs beside attempt N: a lost attempt's retry is not due before its lease's
hard deadline (expiry + ``lostAfterSeconds``, docs/leases.md, Hard deadline), because a worker
that has not yet heard of the loss (revocation, forced offline, replacement, a partition) keeps
its job until its guard ends it at that deadline."""

from __future__ import annotations

from datetime import timedelta

import pytest

from actions.leases.expiry import sweep_expired_leases
from actions.runs import run_retry
from actions.sessions.shutdown import session_operator_offline
from actions.workers import worker_revoke
from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import Run
from runs.outcomes import LOST_RETRY_MARGIN
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, expire_lease, start

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("how", ["revoke", "force_offline", "replace"])
def test_a_lost_attempts_retry_waits_for_its_lease_to_run_out(how, protocol_settings):
    protocol_settings(RUN_LEASE_SECONDS=600)  # far longer than any backoff
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(
        make_revision(
            max_attempts=3, lost_retry="idempotent", retry_backoff_seconds=1, retry_backoff_max_seconds=1
        )
    )
    held = start(claim_one(session))
    expires_at = held.lease().expires_at
    if how == "revoke":
        worker_revoke(worker_id=worker.worker_id)
    elif how == "force_offline":
        session_operator_offline(worker_id=worker.worker_id, force=True)
    else:
        register(worker)
    run.refresh_from_db()
    assert run.state == "retry_wait"
    assert run.next_attempt_at >= expires_at + LOST_RETRY_MARGIN


@pytest.mark.parametrize("lost_after", [None, 45])
def test_an_expired_leases_retry_waits_for_the_hard_deadline(lost_after, protocol_settings):
    protocol_settings(LOST_AFTER_SECONDS=30)
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(
        make_revision(
            max_attempts=2,
            lost_retry="idempotent",
            retry_backoff_seconds=1,
            retry_backoff_max_seconds=1,
            lost_after_seconds=lost_after,
        )
    )
    held = start(claim_one(session))
    expire_lease(held.attempt_id)
    assert sweep_expired_leases() == 1
    run = Run.objects.get(pk=run.pk)
    expires_at = held.lease().expires_at
    assert run.state == "retry_wait"
    deadline = expires_at + timedelta(seconds=lost_after or 30) + LOST_RETRY_MARGIN
    assert deadline <= run.next_attempt_at <= deadline + timedelta(seconds=1)
    assert held.execution["lostAfterSeconds"] == (lost_after or 30)


def test_without_a_hard_deadline_an_expired_lease_retries_after_the_backoff_alone():
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(
        make_revision(
            max_attempts=2,
            lost_retry="idempotent",
            retry_backoff_seconds=1,
            retry_backoff_max_seconds=1,
            lost_after_seconds=0,
        )
    )
    held = start(claim_one(session))

    expire_lease(held.attempt_id)
    assert sweep_expired_leases() == 1
    run = Run.objects.get(pk=run.pk)
    assert run.state == "retry_wait"
    assert (run.next_attempt_at - held.lease().ended_at).total_seconds() <= 1.01


def test_an_operator_retry_of_a_worker_lost_run_waits_for_the_hard_deadline(protocol_settings):
    """The operator's retry is held to the same deadline as an automatic one: the lost attempt may
    run on its partitioned worker until its lease's expiry + lostAfter (its guard's watchdog)."""
    protocol_settings(LOST_AFTER_SECONDS=120)
    session = register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=1, lost_retry="never"))
    held = start(claim_one(session))
    expire_lease(held.attempt_id)
    assert sweep_expired_leases() == 1
    assert Run.objects.get(pk=run.pk).error_class == "worker_lost"
    with pytest.raises(DomainError) as refused:
        run_retry(run_id=run.pk)
    assert refused.value.code == "run_not_finished" and "hard deadline" in str(refused.value)
    assert not Run.objects.filter(retry_of=run.pk).exists()
    lease = held.lease()  # the deadline passed: the retry is accepted
    RunDispatchLease.objects.filter(pk=lease.pk).update(expires_at=lease.expires_at - timedelta(seconds=125))
    assert run_retry(run_id=run.pk).state == "queued"
