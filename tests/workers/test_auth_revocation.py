"""Revocation (ADR-0012 §1, docs/transport.md §5): in one transaction the credentials die, the
session is fenced and the leases follow the lease rules; the next request is refused."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from actions.runs import sweep_due_retries
from actions.workers import worker_revoke
from audit.models import Event
from leases.models import RunDispatchLease
from protocol import wire
from runs.models import Run, RunAttempt
from tests.helpers import SignedClient, enqueue, enrolled_worker, heartbeat, make_revision, register
from tests.leases.flows import claim, start
from workers.models import CredentialState, SessionState, Worker, WorkerCredential, WorkerSession, WorkerState

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy_worker(client):
    """A worker whose session holds one started attempt (lost-retry allowed) and one unstarted."""
    worker = enrolled_worker()
    session = register(worker)
    started_run = enqueue(
        make_revision(command="sleep 60", max_attempts=2, lost_retry="idempotent", retry_backoff_seconds=1)
    )
    unstarted_run = enqueue(make_revision(command="true"))
    held = {offer.run_id: offer for offer in claim(session, 2)}
    start(held[started_run.pk], pid=99)
    api = SignedClient(client, worker)
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200  # warm credential cache
    return worker, session, api, started_run, unstarted_run


def assert_revoked_everywhere(worker, session, started_run, unstarted_run) -> None:
    assert Worker.objects.get(pk=worker.worker_id).state == WorkerState.REVOKED
    assert set(
        WorkerCredential.objects.filter(worker_id=worker.worker_id).values_list("state", flat=True)
    ) == {CredentialState.REVOKED}
    stored = WorkerSession.objects.get(pk=session.session_id)
    assert (stored.state, stored.end_reason, stored.available_slots) == (SessionState.FENCED, "revoked", 0)
    assert set(
        RunDispatchLease.objects.filter(worker_id=worker.worker_id).values_list("state", "release_reason")
    ) == {("released", "worker_revoked")}
    # started → lost, and retried per its policy; unstarted → back to the queue, same attempt
    lost = RunAttempt.objects.get(run=started_run)
    assert lost.state == "lost"
    assert Run.objects.get(pk=started_run.pk).state == "retry_wait"
    waiting = RunAttempt.objects.get(run=unstarted_run)
    assert (waiting.state, waiting.number, waiting.worker_id, waiting.session_id) == (
        "claimed",
        1,
        None,
        None,
    )


def test_revocation_kills_credentials_fences_the_session_and_settles_leases_in_one_go(
    busy_worker, django_capture_on_commit_callbacks
):
    worker, session, api, started_run, unstarted_run = busy_worker
    with django_capture_on_commit_callbacks(execute=True):
        worker_revoke(worker_id=worker.worker_id, actor="alice")
    assert_revoked_everywhere(worker, session, started_run, unstarted_run)
    answer = api.post(wire.SESSION_HEARTBEAT, heartbeat(session))
    assert (answer.status_code, answer.json()["code"]) == (401, "credential_revoked")
    assert Event.objects.filter(kind="worker.revoked", actor="alice").count() == 1
    assert Event.objects.filter(kind="session.fenced", data__reason="revoked").count() == 1

    # … and the work goes elsewhere: the unstarted attempt at once, the lost one when it is due
    other = enrolled_worker()
    other_session = register(other)
    taken = {offer.run_id: offer for offer in claim(other_session, 2)}
    assert set(taken) == {unstarted_run.pk}
    Run.objects.filter(pk=started_run.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert sweep_due_retries() == 1
    retried = {offer.run_id: offer for offer in claim(other_session, 1)}
    assert set(retried) == {started_run.pk}
    assert RunAttempt.objects.get(pk=retried[started_run.pk].attempt_id).number == 2


def test_revocation_is_all_or_nothing(busy_worker, monkeypatch):
    worker, session, _, started_run, _ = busy_worker

    def broken(*args, **kwargs):
        raise RuntimeError("settlement failed half-way")

    monkeypatch.setattr("actions.sessions.endings.settle_session_leases", broken)
    before = (
        list(WorkerCredential.objects.values()),
        list(WorkerSession.objects.values()),
        list(Worker.objects.values()),
        list(RunDispatchLease.objects.values()),
        Event.objects.count(),
    )
    with pytest.raises(RuntimeError):
        worker_revoke(worker_id=worker.worker_id)
    after = (
        list(WorkerCredential.objects.values()),
        list(WorkerSession.objects.values()),
        list(Worker.objects.values()),
        list(RunDispatchLease.objects.values()),
        Event.objects.count(),
    )
    assert after == before


def test_revoking_twice_changes_nothing_the_second_time(busy_worker):
    worker, *_ = busy_worker
    worker_revoke(worker_id=worker.worker_id)
    events = Event.objects.count()
    worker_revoke(worker_id=worker.worker_id)
    assert Event.objects.count() == events


def test_the_admin_action_revokes(busy_worker, admin_client, django_capture_on_commit_callbacks):
    worker, session, api, started_run, unstarted_run = busy_worker
    with django_capture_on_commit_callbacks(execute=True):
        answer = admin_client.post(
            "/admin/workers/worker/",
            {"action": "revoke", "_selected_action": [str(worker.worker_id)]},
            follow=True,
        )
    assert answer.status_code == 200
    assert_revoked_everywhere(worker, session, started_run, unstarted_run)
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).json()["code"] == "credential_revoked"
    assert Event.objects.get(kind="worker.revoked").actor == "admin"


def test_the_command_revokes(busy_worker, django_capture_on_commit_callbacks):
    worker, session, api, started_run, unstarted_run = busy_worker
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("worker_admin", "revoke", worker.name, stdout=out)
    assert "state=revoked" in out.getvalue()
    assert_revoked_everywhere(worker, session, started_run, unstarted_run)
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).json()["code"] == "credential_revoked"
