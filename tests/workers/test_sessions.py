"""Session registration, replay, replacement and fencing (ADR-0012 §2), through the services."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.shutdown import session_drain, session_offline
from audit.models import Event
from core.conf import protocol
from core.errors import DomainError
from protocol.ids import uuid7
from tests.helpers import enrolled_worker, register, snapshot
from workers.models import SessionState, WorkerSession

pytestmark = pytest.mark.django_db


def rows():
    """Everything a refused call must not change."""
    return (
        list(WorkerSession.objects.order_by("pk").values()),
        Event.objects.count(),
    )


def test_first_registration_is_generation_1_version_0():
    worker = enrolled_worker()
    session = register(worker)
    assert (session.generation, session.version) == (1, 0)
    stored = WorkerSession.objects.get(pk=session.session_id)
    assert stored.state == SessionState.ONLINE
    assert stored.capabilities_sha256 == snapshot().sha256
    assert Event.objects.filter(kind="session.registered", session_id=session.session_id).count() == 1


def test_identical_registration_is_an_exact_replay_that_writes_nothing():
    worker = enrolled_worker()
    session = register(worker)
    before = rows()
    again = register(worker, session_id=session.session_id)
    assert (again.generation, again.version) == (session.generation, session.version)
    assert rows() == before


def test_same_session_with_other_content_is_a_conflict_and_audited():
    worker = enrolled_worker()
    session = register(worker)
    sessions_before = list(WorkerSession.objects.values())
    with pytest.raises(DomainError) as refused:
        register(worker, session_id=session.session_id, snap=snapshot(cpuCount=64))
    assert refused.value.code == "session_replay_conflict"
    assert refused.value.status == 409
    assert list(WorkerSession.objects.values()) == sessions_before
    assert Event.objects.filter(kind="session.replay_conflict").count() == 1


def test_new_session_replaces_and_fences_the_old_one():
    worker = enrolled_worker()
    first = register(worker)
    second = register(worker)
    assert second.generation == 2 and second.version > first.version
    old = WorkerSession.objects.get(pk=first.session_id)
    assert old.state == SessionState.FENCED and old.end_reason == "superseded"
    assert (
        WorkerSession.objects.filter(worker_id=worker.worker_id, state__in=["online", "draining"]).count()
        == 1
    )
    before = rows()
    with pytest.raises(DomainError) as refused:
        session_heartbeat(
            worker_id=worker.worker_id,
            session_id=first.session_id,
            generation=first.generation,
            expected_version=first.version,
            available_slots=1,
        )
    assert refused.value.code == "session_superseded" and refused.value.status == 409
    assert rows() == before


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"generation": 2}, "session_generation_mismatch"),
        ({"expected_version": 7}, "session_version_conflict"),
        ({"session_id": "new"}, "session_unknown"),
        # The API accepts 19-digit integers; on PostgreSQL the heartbeat's statement compares them
        # as numeric, so they miss like any other wrong value (not a cast error, a 500).
        ({"generation": 2**63}, "session_generation_mismatch"),
        ({"expected_version": 2**63}, "session_version_conflict"),
        ({"expected_version": 10**19 - 1}, "session_version_conflict"),
        ({"available_slots": 10**19 - 1}, "slots_exceed_maximum"),
    ],
)
def test_heartbeat_fence_faults_fail_closed(change, code):
    worker = enrolled_worker()
    session = register(worker)
    call = {
        "worker_id": worker.worker_id,
        "session_id": session.session_id,
        "generation": session.generation,
        "expected_version": session.version,
        "available_slots": 2,
    }
    if change.get("session_id") == "new":
        change = {"session_id": uuid7()}
    before = rows()
    with pytest.raises(DomainError) as refused:
        session_heartbeat(**{**call, **change})
    assert refused.value.code == code
    assert rows() == before


def test_expired_session_lease_fails_closed_without_a_sweep():
    worker = enrolled_worker()
    session = register(worker)
    WorkerSession.objects.filter(pk=session.session_id).update(
        lease_expires_at=WorkerSession.objects.get(pk=session.session_id).registered_at - timedelta(seconds=1)
    )
    before = rows()
    with pytest.raises(DomainError) as refused:
        session_heartbeat(
            worker_id=worker.worker_id,
            session_id=session.session_id,
            generation=1,
            expected_version=0,
            available_slots=2,
        )
    assert refused.value.code == "session_expired"
    assert rows() == before


def test_unchanged_heartbeat_writes_nothing_until_half_the_lease_is_used():
    worker = enrolled_worker()
    session = register(worker)
    before = rows()
    session_heartbeat(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        expected_version=0,
        available_slots=2,
    )
    assert rows() == before
    stored = WorkerSession.objects.get(pk=session.session_id)
    used = timedelta(seconds=protocol().session_lease_seconds / 2 + 5)  # past half the lease
    WorkerSession.objects.filter(pk=stored.pk).update(lease_expires_at=stored.lease_expires_at - used)
    session_heartbeat(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        expected_version=0,
        available_slots=2,
    )
    extended = WorkerSession.objects.get(pk=stored.pk)
    assert extended.lease_expires_at > stored.lease_expires_at - used
    assert extended.version == 0  # a lease extension is not a state change


def test_slot_change_bumps_version_and_slots_never_exceed_the_maximum():
    worker = enrolled_worker()
    session = register(worker, max_concurrent=2)
    view = session_heartbeat(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        expected_version=0,
        available_slots=1,
    )
    assert (view.session.available_slots, view.session.version) == (1, 1)
    with pytest.raises(DomainError) as refused:
        session_heartbeat(
            worker_id=worker.worker_id,
            session_id=session.session_id,
            generation=1,
            expected_version=1,
            available_slots=3,
        )
    assert refused.value.code == "slots_exceed_maximum"


def test_drain_zeroes_capacity_and_keeps_heartbeats_valid():
    worker = enrolled_worker()
    session = register(worker)
    view = session_drain(
        worker_id=worker.worker_id, session_id=session.session_id, generation=1, expected_version=0
    )
    assert (view.session.state, view.session.available_slots, view.session.version) == ("draining", 0, 1)
    beat = session_heartbeat(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        expected_version=1,
        available_slots=2,
    )
    assert beat.session.available_slots == 0


def test_offline_ends_the_session():
    worker = enrolled_worker()
    session = register(worker)
    view = session_offline(
        worker_id=worker.worker_id, session_id=session.session_id, generation=1, expected_version=0
    )
    assert view.session.state == "offline" and view.session.available_slots == 0
    with pytest.raises(DomainError) as refused:
        session_heartbeat(
            worker_id=worker.worker_id,
            session_id=session.session_id,
            generation=1,
            expected_version=view.session.version,
            available_slots=1,
        )
    assert refused.value.code == "session_offline"


def test_session_id_must_be_uuid7():
    worker = enrolled_worker()
    with pytest.raises(DomainError) as refused:
        register(worker, session_id=uuid.uuid4())
    assert refused.value.code == "session_id_invalid"
