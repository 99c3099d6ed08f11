"""The session lease (ADR-0012 §3): visibility by the database clock, the expiry sweep, the
heartbeat write rule, capacity bounds and the timings each profile sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from actions.credentials import credential_force_rotation
from actions.leases.activation import lease_starting
from actions.leases.claims import OfferRequest, lease_claim
from actions.runs import run_cancel
from actions.sessions.expiry import session_expire, sweep_expired_sessions
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.shutdown import session_drain, session_offline
from actions.workers import worker_revoke
from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from placement.selectors import live_workers
from protocol import wire
from protocol.ids import uuid7
from runs.models import RunAttempt
from tests.helpers import (
    OfferTicket,
    SignedClient,
    enqueue,
    enrolled_worker,
    make_revision,
    register,
    snapshot_rows,
)
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def lapse(session_id, seconds: float = 1) -> None:
    """Move the session's lease into the past by the database clock (time is not slept)."""
    WorkerSession.objects.filter(pk=session_id).update(lease_expires_at=db_now() - timedelta(seconds=seconds))


def age(session_id, seconds: float) -> None:
    """Pretend ``seconds`` passed since the lease was last extended."""
    stored = WorkerSession.objects.get(pk=session_id)
    WorkerSession.objects.filter(pk=session_id).update(
        lease_expires_at=stored.lease_expires_at - timedelta(seconds=seconds)
    )


def heartbeat(session, *, version=None, slots=2):
    return session_heartbeat(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=session.version if version is None else version,
        available_slots=slots,
    )


# --- visibility ----------------------------------------------------------------------------------


def test_a_lapsed_session_leaves_the_candidates_at_once_without_a_sweep():
    stays, lapses = register(enrolled_worker()), register(enrolled_worker())
    assert {w.session_id for w in live_workers(now=db_now())} == {stays.session_id, lapses.session_id}
    lapse(lapses.session_id, seconds=0.001)
    assert [w.session_id for w in live_workers(now=db_now())] == [stays.session_id]
    assert WorkerSession.objects.get(pk=lapses.session_id).state == "online"  # not swept yet
    enqueue(make_revision())
    with pytest.raises(DomainError) as refused:
        lease_claim(
            worker_id=lapses.worker.worker_id,
            session_id=lapses.session_id,
            generation=1,
            offers=[OfferRequest(OfferTicket().offer_id, OfferTicket().token)],
        )
    assert refused.value.code == "session_expired"


def test_draining_offline_fenced_and_revoked_sessions_are_never_candidates():
    online = register(enrolled_worker())
    draining = register(enrolled_worker())
    session_drain(
        worker_id=draining.worker.worker_id, session_id=draining.session_id, generation=1, expected_version=0
    )
    offline = register(enrolled_worker())
    session_offline(
        worker_id=offline.worker.worker_id, session_id=offline.session_id, generation=1, expected_version=0
    )
    revoked = register(enrolled_worker())
    worker_revoke(worker_id=revoked.worker.worker_id)
    replaced = enrolled_worker()
    register(replaced)
    current = register(replaced)
    assert {w.session_id for w in live_workers(now=db_now())} == {online.session_id, current.session_id}


# --- the sweep -----------------------------------------------------------------------------------


def test_sweep_marks_lapsed_sessions_expired_once_and_settles_their_leases():
    worker = enrolled_worker()
    session = register(worker)
    fresh = register(enrolled_worker())
    run = enqueue(make_revision())
    ticket = OfferTicket()
    (offer,) = lease_claim(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        offers=[OfferRequest(ticket.offer_id, ticket.token)],
    )
    lapse(session.session_id)

    assert sweep_expired_sessions() == 1

    expired = WorkerSession.objects.get(pk=session.session_id)
    assert (expired.state, expired.end_reason, expired.available_slots) == ("expired", "lease_expired", 0)
    assert expired.version == 1 and expired.ended_at is not None
    assert WorkerSession.objects.get(pk=fresh.session_id).state == "online"
    lease = RunDispatchLease.objects.get(pk=offer.lease.pk)
    assert (lease.state, lease.release_reason) == ("released", "session_expired")
    assert RunAttempt.objects.get(run=run).state == "claimed"  # unstarted: back in the queue
    event = Event.objects.get(kind="session.expired")
    assert (event.session_id, event.actor_type, event.data) == (
        session.session_id,
        "reconciler",
        {"generation": 1, "settled_leases": 1},
    )
    before = snapshot_rows()
    assert sweep_expired_sessions() == 0
    assert session_expire(session_id=session.session_id) is False
    assert snapshot_rows() == before


def test_sweep_leaves_a_session_alone_whose_heartbeat_extended_it_first():
    session = register(enrolled_worker())
    age(session.session_id, 20)  # 10 s left of 30: past half its life
    lapsed_ids = [session.session_id]
    heartbeat(session)  # extends
    before = snapshot_rows()
    assert [session_expire(session_id=sid) for sid in lapsed_ids] == [False]
    assert snapshot_rows() == before


def test_sweep_is_bounded_by_its_batch_oldest_first():
    sessions = [register(enrolled_worker()) for _ in range(3)]
    for offset, session in enumerate(sessions):
        lapse(session.session_id, seconds=10 - offset)
    assert sweep_expired_sessions(batch=2) == 2
    states = [WorkerSession.objects.get(pk=s.session_id).state for s in sessions]
    assert states == ["expired", "expired", "online"]


def test_unknown_session_id_is_not_expired():
    assert session_expire(session_id=uuid7()) is False


# --- the heartbeat write rule ---------------------------------------------------------------------

WRITES = ("INSERT", "UPDATE", "DELETE", "SAVEPOINT", "BEGIN")


def writes_in(queries) -> list[str]:
    return [
        q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(WRITES) or "FOR UPDATE" in q["sql"]
    ]


def test_an_unchanged_heartbeat_on_a_fresh_lease_is_a_pure_read():
    session = register(enrolled_worker())
    before = snapshot_rows()
    with CaptureQueriesContext(connection) as queries:
        view = heartbeat(session)
    assert writes_in(queries) == []
    # SQLite: session + worker + clock, then cancellations; PostgreSQL: one statement for both
    assert len(queries) == (1 if connection.vendor == "postgresql" else 2), [q["sql"] for q in queries]
    assert snapshot_rows() == before
    assert (view.session.version, view.session.available_slots) == (0, 2)


def test_past_half_its_life_the_lease_is_extended_to_now_plus_ttl_without_a_version_bump(protocol_settings):
    protocol_settings(SESSION_LEASE_SECONDS=30)
    session = register(enrolled_worker())
    age(session.session_id, 14)  # 16 s left: not yet past half
    before = snapshot_rows()
    heartbeat(session)
    assert snapshot_rows() == before
    age(session.session_id, 2)  # 14 s left: past half
    with CaptureQueriesContext(connection) as queries:
        view = heartbeat(session)
    unquoted = [q["sql"].upper().replace('"', "") for q in queries]
    updates = [sql for sql in unquoted if "UPDATE WORKERS_WORKERSESSION" in sql]
    assert len(updates) == 1
    stored = WorkerSession.objects.get(pk=session.session_id)
    assert stored.version == 0 and view.session.version == 0
    assert stored.lease_expires_at - view.server_time == timedelta(seconds=30)
    assert not Event.objects.filter(kind__startswith="session.").exclude(kind="session.registered").exists()


def test_a_slot_change_bumps_the_version_once_and_keeps_a_fresh_lease():
    session = register(enrolled_worker(), max_concurrent=4)
    expires = WorkerSession.objects.get(pk=session.session_id).lease_expires_at
    view = heartbeat(session, slots=1)
    stored = WorkerSession.objects.get(pk=session.session_id)
    assert (stored.available_slots, stored.version, stored.lease_expires_at) == (1, 1, expires)
    assert view.session.version == 1
    # the same slots again: nothing to write
    before = snapshot_rows()
    heartbeat(session, version=1, slots=1)
    assert snapshot_rows() == before


def test_a_draining_session_keeps_zero_capacity_whatever_it_reports():
    session = register(enrolled_worker())
    session_drain(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=1, expected_version=0
    )
    before = snapshot_rows()
    view = heartbeat(session, version=1, slots=2)
    assert (view.session.state, view.session.available_slots) == ("draining", 0)
    assert snapshot_rows() == before


def test_available_slots_never_exceed_the_declared_maximum(client):
    session = register(enrolled_worker(), max_concurrent=2)
    before = snapshot_rows()
    with pytest.raises(DomainError) as refused:
        heartbeat(session, slots=3)
    assert (refused.value.code, refused.value.field) == ("slots_exceed_maximum", "availableSlots")
    answer = SignedClient(client, session.worker).post(
        wire.SESSION_HEARTBEAT, {**session.fence(), "expectedVersion": 0, "availableSlots": 3}
    )
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        422,
        "slots_exceed_maximum",
        "availableSlots",
    )
    assert snapshot_rows() == before

    with pytest.raises(IntegrityError), transaction.atomic():  # and the database agrees
        WorkerSession.objects.filter(pk=session.session_id).update(available_slots=3)


def test_a_heartbeat_never_revives_a_lapsed_lease():
    session = register(enrolled_worker())
    lapse(session.session_id)
    before = snapshot_rows()
    for slots in (2, 1):  # the pure-read path and the write path
        with pytest.raises(DomainError) as refused:
            heartbeat(session, slots=slots)
        assert refused.value.code == "session_expired"
    assert snapshot_rows() == before


def test_heartbeat_answers_cancellations_and_rotation_requests():

    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(make_revision())
    ticket = OfferTicket()
    (offer,) = lease_claim(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        offers=[OfferRequest(ticket.offer_id, ticket.token)],
    )
    lease_starting(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        attempt_id=offer.lease.attempt_id,
        lease_generation=offer.lease.lease_generation,
        lease_token=ticket.token,
        offer_id=ticket.offer_id,
        lease_version=0,
    )
    run_cancel(run_id=run.pk)
    credential_force_rotation(worker_id=worker.worker_id)
    view = heartbeat(session)
    assert view.cancel_requested == (offer.lease.attempt_id,)
    assert view.rotation_required is True


# --- timings per profile -------------------------------------------------------------------------


@pytest.mark.sqlite  # settings only, in a subprocess: run once, in the SQLite leg
@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (
            "standalone",
            {"SESSION_LEASE_SECONDS": 70, "HEARTBEAT_INTERVAL_SECONDS": 10, "HEARTBEAT_JITTER_RATIO": 0.1},
        ),
        (
            "cluster-control",
            {"SESSION_LEASE_SECONDS": 100, "HEARTBEAT_INTERVAL_SECONDS": 15, "HEARTBEAT_JITTER_RATIO": 0.1},
        ),
    ],
)
def test_each_profile_sets_its_session_timings_and_the_environment_overrides_them(profile, expected):
    code = (
        "import json, django; from django.conf import settings; django.setup(); "
        "print(json.dumps({k: settings.QINGLONG[k] for k in "
        "('SESSION_LEASE_SECONDS', 'HEARTBEAT_INTERVAL_SECONDS', 'HEARTBEAT_JITTER_RATIO')}))"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("QINGLONG_")}
    env.update(
        DJANGO_SETTINGS_MODULE="qinglong.settings",
        QINGLONG_PROFILE=profile,
        DJANGO_SECRET_KEY="test",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/unused"
        if profile == "cluster-control"
        else "sqlite:///:memory:",
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(shown.stdout) == expected
    env["QINGLONG_SESSION_LEASE_SECONDS"] = "120"
    shown = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(shown.stdout)["SESSION_LEASE_SECONDS"] == 120
