"""Cancellation across a run's life (docs/leases.md, Cancellation): recorded durably; a pending
attempt ends at once; a dispatched or running one learns it from its next ACK/renew/heartbeat and the worker
ends it; a vanished worker's attempt is cancelled, never retried; no new attempt ever follows."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from actions.leases.activation import lease_start_failed
from actions.leases.expiry import sweep_expired_leases
from actions.runs import run_cancel
from actions.sessions.heartbeat import session_heartbeat
from runs.models import Run, RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, expire_lease, renew, start, starting

pytestmark = pytest.mark.django_db

RETRYING = dict(max_attempts=3, retry_on=("failed", "timed_out"), lost_retry="idempotent")


def heartbeat_cancels(session) -> tuple:
    view = session_heartbeat(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=session.version,
        available_slots=2,
    )  # unchanged: a pure read
    return view.cancel_requested


def test_a_dispatched_attempt_learns_it_at_its_starting_ack_and_from_heartbeats():
    session = register(enrolled_worker())
    run = enqueue(make_revision(**RETRYING))
    held = claim_one(session)
    assert heartbeat_cancels(session) == ()
    run_cancel(run_id=run.pk)
    assert Run.objects.get(pk=run.pk).state == "dispatching"  # a live lease: the worker must hear it
    assert heartbeat_cancels(session) == (held.attempt_id,)
    assert starting(held).cancel_requested is True
    lease_start_failed(**held.fence(), offer_id=held.ticket.offer_id, lease_version=0, reason="cancelled")
    run.refresh_from_db()
    assert (run.state, held.attempt().state, held.lease().state) == ("cancelled", "cancelled", "completed")
    assert RunAttempt.objects.filter(run=run).count() == 1
    assert heartbeat_cancels(session) == ()


def test_a_running_attempt_learns_it_from_renew_and_its_cancelled_completion_ends_the_run():
    session = register(enrolled_worker())
    run = enqueue(make_revision(**RETRYING))
    held = start(claim_one(session))
    run_cancel(run_id=run.pk, reason="operator said so")
    assert renew(held).cancel_requested is True
    assert heartbeat_cancels(session) == (held.attempt_id,)
    complete(held, outcome="cancelled", exit_code=None)
    run.refresh_from_db()
    assert (run.state, run.error_class, run.cancel_reason) == (
        "cancelled",
        "cancelled_by_user",
        "operator said so",
    )
    assert RunAttempt.objects.filter(run=run).count() == 1


def test_a_dispatched_attempt_whose_worker_vanished_is_cancelled_at_the_dispatch_timeout():
    session = register(enrolled_worker())
    run = enqueue(make_revision(**RETRYING))
    held = claim_one(session)
    run_cancel(run_id=run.pk)
    expire_lease(held.attempt_id)
    assert sweep_expired_leases() == 1
    run.refresh_from_db()
    assert (run.state, held.attempt().state, held.lease().release_reason) == (
        "cancelled",
        "cancelled",
        "dispatch_timeout",
    )


def test_cancelling_a_claimed_attempt_whose_lease_lapsed_unswept_cancels_it_at_once():
    session = register(enrolled_worker())
    run = enqueue(make_revision(**RETRYING))
    held = claim_one(session)
    expire_lease(held.attempt_id)
    run_cancel(run_id=run.pk)
    run.refresh_from_db()
    assert (run.state, held.attempt().state) == ("cancelled", "cancelled")
    assert (held.lease().state, held.lease().release_reason) == ("released", "cancelled")
    assert sweep_expired_leases() == 0


def test_a_worker_failure_after_the_cancel_still_ends_the_run_cancelled_without_retry():
    session = register(enrolled_worker())
    run = enqueue(make_revision(**RETRYING))
    held = start(claim_one(session))
    run_cancel(run_id=run.pk)
    complete(held, outcome="timed_out", exit_code=None)
    run.refresh_from_db()
    assert run.state == "cancelled" and RunAttempt.objects.filter(run=run).count() == 1


def test_cancel_from_the_admin(client):
    admin = get_user_model().objects.create_superuser("root", password="pw-for-the-test")
    client.force_login(admin)
    queued = enqueue(make_revision())
    answer = client.post("/admin/runs/run/", {"action": "cancel", "_selected_action": [str(queued.pk)]})
    assert answer.status_code == 302
    assert Run.objects.get(pk=queued.pk).state == "cancelled"
