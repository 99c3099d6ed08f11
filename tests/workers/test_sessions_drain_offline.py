"""Drain and offline (ADR-0012 §5, docs/sessions.md, Drain and offline): capacity zero with the drain, offline
only once the session's run leases ended — unless an operator forces it from the admin or the
command line, which settles those leases as lost."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from actions.leases.completion import Completion, lease_complete
from actions.runs import sweep_due_retries
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.shutdown import session_drain, session_offline, session_operator_offline
from audit.models import Event
from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol import wire
from runs.models import Run, RunAttempt
from tests.helpers import SignedClient, enqueue, enrolled_worker, make_revision, register, snapshot_rows
from tests.leases.flows import claim, claim_one, start
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db


def current(session) -> WorkerSession:
    return WorkerSession.objects.get(pk=session.session_id)


def test_drain_zeroes_capacity_with_its_event_keeps_heartbeats_and_refuses_claims(client):
    session = register(enrolled_worker(), max_concurrent=3)
    enqueue(make_revision())
    view = session_drain(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=1, expected_version=0
    )
    assert (view.session.state, view.session.available_slots, view.session.version) == ("draining", 0, 1)
    drained = Event.objects.get(kind="session.drained")
    assert (drained.session_id, drained.data) == (session.session_id, {"generation": 1, "by": "worker"})
    beat = session_heartbeat(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=1,
        expected_version=1,
        available_slots=3,
    )
    assert beat.session.available_slots == 0
    before = snapshot_rows()
    with pytest.raises(DomainError) as refused:
        claim(session)
    assert refused.value.code == "session_draining"
    again = session_drain(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=1, expected_version=1
    )
    assert again.session.version == 1
    assert snapshot_rows() == before


def test_offline_is_refused_while_leases_are_active_and_allowed_once_they_end(client):
    session = register(enrolled_worker())
    enqueue(make_revision())
    fence = start(claim_one(session), pid=9).fence()
    session_drain(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=1, expected_version=0
    )
    api = SignedClient(client, session.worker)
    before = snapshot_rows()
    answer = api.post(wire.SESSION_OFFLINE, {**session.fence(), "expectedVersion": 1})
    assert answer.status_code == 409
    assert answer.json()["code"] == "session_has_active_leases"
    assert answer.json()["details"] == {"activeLeases": 1}
    assert snapshot_rows() == before
    assert current(session).state == "draining"  # stays draining while its lease runs

    lease_complete(**fence, completion=Completion(1, "succeeded", 0))
    answer = api.post(wire.SESSION_OFFLINE, {**session.fence(), "expectedVersion": 1})
    assert answer.status_code == 200, answer.json()
    ended = current(session)
    assert (ended.state, ended.end_reason, ended.available_slots, ended.version) == (
        "offline",
        "worker_offline",
        0,
        2,
    )
    offline = Event.objects.get(kind="session.offline")
    assert offline.data == {"generation": 1, "forced": False, "settled_leases": 0}


def test_operator_offline_without_force_is_refused_with_active_leases():
    session = register(enrolled_worker())
    enqueue(make_revision())
    claim(session)
    before = snapshot_rows()
    with pytest.raises(DomainError) as refused:
        session_operator_offline(worker_id=session.worker.worker_id, actor="ops")
    assert refused.value.code == "session_has_active_leases"
    assert snapshot_rows() == before


def test_forced_offline_settles_started_attempts_as_lost_and_requeues_unstarted_ones():
    worker = enrolled_worker()
    session = register(worker, max_concurrent=2)
    started_run = enqueue(
        make_revision(
            command="echo started",
            max_attempts=2,
            lost_retry="idempotent",
            retry_backoff_seconds=1,
            retry_backoff_max_seconds=1,
        )
    )
    waiting_run = enqueue(make_revision(command="echo waiting"))
    by_run = {held.run_id: held for held in claim(session, 2)}
    fence = start(by_run[started_run.pk], pid=9).fence()

    view = session_operator_offline(worker_id=worker.worker_id, force=True, actor="ops")

    assert (view.session.state, view.session.end_reason, view.session.available_slots) == (
        "offline",
        "forced_offline",
        0,
    )
    assert set(RunDispatchLease.objects.values_list("state", "release_reason")) == {
        ("released", "session_offline")
    }
    lost = RunAttempt.objects.get(run=started_run)
    assert lost.state == "lost"
    assert Run.objects.get(pk=started_run.pk).state == "retry_wait"  # retried per its policy
    assert RunAttempt.objects.get(run=waiting_run).state == "claimed"  # back in the queue
    event = Event.objects.get(kind="session.offline")
    assert (event.actor_type, event.actor, event.data) == (
        "operator",
        "ops",
        {"generation": 1, "forced": True, "settled_leases": 2},
    )
    # the worker's process is fenced from now on
    with pytest.raises(DomainError) as refused:
        lease_complete(**fence, completion=Completion(1, "succeeded", 0))
    assert refused.value.code == "session_offline"
    # and the retry goes to a new attempt once due (not to the offline session)
    Run.objects.filter(pk=started_run.pk).update(next_attempt_at=lost.finished_at)
    assert sweep_due_retries() == 1
    assert RunAttempt.objects.filter(run=started_run).count() == 2


def test_operator_offline_of_a_worker_without_a_live_session_is_refused():
    session = register(enrolled_worker())
    session_offline(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=1, expected_version=0
    )
    with pytest.raises(DomainError) as refused:
        session_operator_offline(worker_id=session.worker.worker_id, force=True)
    assert (refused.value.code, refused.value.status) == ("no_live_session", 409)


def test_management_command_refuses_then_forces(capsys):
    session = register(enrolled_worker())
    enqueue(make_revision())
    claim(session)
    with pytest.raises(CommandError, match="session_has_active_leases"):
        call_command("session_offline", session.worker.name)
    assert current(session).state == "online"
    call_command("session_offline", session.worker.name, "--force")
    assert "offline (forced_offline)" in capsys.readouterr().out
    assert current(session).state == "offline"
    with pytest.raises(CommandError, match="no_live_session"):
        call_command("session_offline", session.worker.name)
    with pytest.raises(CommandError, match="no worker named"):
        call_command("session_offline", "nobody")


def test_admin_action_forces_offline(admin_client):
    session = register(enrolled_worker())
    enqueue(make_revision())
    claim(session)
    answer = admin_client.post(
        "/admin/workers/worker/",
        {"action": "force_offline", "_selected_action": [str(session.worker.worker_id)]},
        follow=True,
    )
    assert answer.status_code == 200
    messages = [str(m) for m in answer.context["messages"]]
    assert messages == [f"{session.worker.name}: session offline"]
    assert current(session).state == "offline"
    assert RunDispatchLease.objects.get().release_reason == "session_offline"
    # a second click reports the refusal instead of failing
    answer = admin_client.post(
        "/admin/workers/worker/",
        {"action": "force_offline", "_selected_action": [str(session.worker.worker_id)]},
        follow=True,
    )
    assert [str(m) for m in answer.context["messages"]] == [
        f"{session.worker.name}: no_live_session: the worker has no online or draining session"
    ]
