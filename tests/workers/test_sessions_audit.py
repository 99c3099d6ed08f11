"""Session audit events (ADR-0012 §2, §5; docs/placement.md §6): each session fact writes exactly
one low-cardinality event row, in the same transaction as the fact itself."""

from __future__ import annotations

from datetime import timedelta

import pytest

from actions.sessions.expiry import sweep_expired_sessions
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.shutdown import session_drain, session_offline
from actions.workers import worker_revoke
from audit import recorder
from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from tests.helpers import enrolled_worker, register, snapshot, snapshot_rows
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db


def replace(session):
    register(session.worker)


def drain(session):
    session_drain(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=session.version,
    )


def offline(session):
    session_offline(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=session.version,
    )


def lapse(session):
    WorkerSession.objects.filter(pk=session.session_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )


def expire(session):
    lapse(session)
    sweep_expired_sessions()


def conflict(session):
    register(session.worker, session_id=session.session_id, snap=snapshot(cpuCount=99))


def storm(session):
    register(session.worker)  # the one takeover the limit allows
    register(session.worker)


def revoke(session):
    worker_revoke(worker_id=session.worker.worker_id, actor="ops")


#: action -> (session.* event kinds it writes, in order; data keys of each)
ACTIONS = {
    "register": (None, [("session.registered", {"generation", "replaced", "draining"})]),
    "replace": (
        replace,
        [
            ("session.fenced", {"reason", "generation", "settled_leases"}),
            ("session.registered", {"generation", "replaced", "draining"}),
            ("session.replaced", {"generation", "previous_generation"}),
        ],
    ),
    "drain": (drain, [("session.drained", {"generation", "by"})]),
    "offline": (offline, [("session.offline", {"generation", "forced", "settled_leases"})]),
    "expire": (expire, [("session.expired", {"generation", "settled_leases"})]),
    "replay-conflict": (conflict, [("session.replay_conflict", {"reason"})]),
    "storm": (
        storm,
        [
            ("session.fenced", {"reason", "generation", "settled_leases"}),
            ("session.registered", {"generation", "replaced", "draining"}),
            ("session.replaced", {"generation", "previous_generation"}),
            ("session.takeover_limited", {"limit", "retry_after_s"}),
        ],
    ),
    "revoke": (revoke, [("session.fenced", {"reason", "generation", "settled_leases"})]),
}


@pytest.mark.parametrize("name", ACTIONS)
def test_each_session_fact_writes_exactly_one_low_cardinality_event(name, protocol_settings):
    protocol_settings(TAKEOVERS_PER_MINUTE=1)
    action, expected = ACTIONS[name]
    session = register(enrolled_worker())
    mark = Event.objects.order_by("-pk").values_list("pk", flat=True).first() if action else 0
    if action is not None:
        try:
            action(session)
        except DomainError as refused:
            assert name in ("replay-conflict", "storm"), refused
    events = list(Event.objects.filter(pk__gt=mark, kind__startswith="session.").order_by("pk"))
    assert [(e.kind, set(e.data)) for e in events] == expected
    for event in events:
        assert event.worker_id == session.worker.worker_id
        for value in event.data.values():  # low cardinality: small scalars only
            assert isinstance(value, bool | int) or (isinstance(value, str) and len(value) <= 32)


def test_refusals_other_than_the_audited_two_write_no_event():
    session = register(enrolled_worker())
    offline(session)
    mark = Event.objects.latest("pk").pk
    for call in (
        drain,
        offline,
        lambda s: session_heartbeat(
            worker_id=s.worker.worker_id,
            session_id=s.session_id,
            generation=1,
            expected_version=0,
            available_slots=1,
        ),
    ):
        with pytest.raises(DomainError):
            call(session)
    assert not Event.objects.filter(pk__gt=mark).exists()


#: fact -> (action, the event kind whose failure must undo the whole fact)
ATOMIC = {
    "registered": (None, "session.registered"),
    "replaced": (replace, "session.replaced"),
    "fenced": (replace, "session.fenced"),
    "drained": (drain, "session.drained"),
    "offline": (offline, "session.offline"),
    "expired": (lambda session: sweep_expired_sessions(), "session.expired"),
}
#: Time moves before the snapshot is taken: it is the world the fact starts from.
PREPARE = {"expired": lapse}


@pytest.mark.parametrize("fact", ATOMIC)
def test_the_event_and_the_fact_commit_together(fact, monkeypatch):
    """If writing the event fails after the row was inserted, the fact it records is undone too."""
    action, kind = ATOMIC[fact]
    worker = enrolled_worker()
    session = None if action is None else register(worker)
    real_record = recorder.record

    def failing_record(event_kind, **kwargs):
        written = real_record(event_kind, **kwargs)
        if event_kind == kind:
            raise RuntimeError(f"audit store failed after writing {event_kind}")
        return written

    for module in ("endings", "registration", "shutdown"):  # the session modules that write events
        monkeypatch.setattr(f"actions.sessions.{module}.record", failing_record)
    if fact in PREPARE:
        PREPARE[fact](session)
    before = snapshot_rows()
    with pytest.raises(RuntimeError, match="audit store failed"):
        if action is None:
            register(worker)
        else:
            action(session)
    assert snapshot_rows() == before
