"""Registration semantics (ADR-0012 §2; docs/sessions.md, fail-closed matrix): first, replay,
conflict, replacement, lapsed predecessors, the takeover-storm limit, drain and revocation across restarts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils.dateparse import parse_datetime

from actions.sessions.expiry import sweep_expired_sessions
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.shutdown import session_drain, session_offline
from actions.workers import worker_drain, worker_revoke, worker_undrain
from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol import wire
from protocol.ids import uuid7
from runs.models import Run, RunAttempt
from tests.helpers import (
    BASE_SNAPSHOT,
    SignedClient,
    enqueue,
    enrolled_worker,
    make_revision,
    register,
    register_body,
    snapshot,
    snapshot_rows,
)
from tests.leases.flows import claim, starting
from workers.models import SessionState, WorkerSession
from workers.sessions import SessionView

pytestmark = pytest.mark.django_db

#: Answer fields that depend on when the answer was made.
TIMING = {"serverTime", "nextHeartbeatAt"}


def without_timing(answer: dict) -> dict:
    return {key: value for key, value in answer.items() if key not in TIMING}


def live(worker) -> list[WorkerSession]:
    return list(WorkerSession.objects.filter(worker_id=worker.worker_id, state__in=["online", "draining"]))


def test_first_registration_over_http_is_generation_1_version_0_with_server_timers(client, protocol_settings):
    protocol_settings(SESSION_LEASE_SECONDS=40, HEARTBEAT_INTERVAL_SECONDS=12, HEARTBEAT_JITTER_RATIO=0.25)
    worker = enrolled_worker()
    session_id = uuid7()
    answer = SignedClient(client, worker).post(wire.SESSION_REGISTER, register_body(session_id=session_id))
    out = answer.json()
    assert answer.status_code == 201, out
    assert (out["generation"], out["version"], out["state"], out["replacedSession"]) == (
        1,
        0,
        "online",
        False,
    )
    stored = WorkerSession.objects.get(pk=session_id)
    # the lease is the database clock at registration plus the configured TTL
    assert stored.lease_expires_at - stored.registered_at == timedelta(seconds=40)
    assert out["heartbeatIntervalSeconds"] == 12

    delay = (parse_datetime(out["nextHeartbeatAt"]) - parse_datetime(out["serverTime"])).total_seconds()
    assert 12 * 0.75 <= delay <= 12 * 1.25
    assert Event.objects.filter(kind="session.registered", session_id=session_id).count() == 1


def test_next_heartbeat_time_is_jittered_within_the_ratio(protocol_settings):
    protocol_settings(HEARTBEAT_INTERVAL_SECONDS=10, HEARTBEAT_JITTER_RATIO=0.1)
    view = SessionView(session=None, server_time=db_now())
    delays = {(view.next_heartbeat_at - view.server_time).total_seconds() for _ in range(200)}
    assert all(9.0 <= d <= 11.0 for d in delays)
    assert len(delays) > 100  # actually jittered, not a constant


def test_exact_replay_answers_the_same_and_writes_nothing(client):
    worker = enrolled_worker()
    api = SignedClient(client, worker)
    register(worker)
    session_id = uuid7()
    first = api.post(wire.SESSION_REGISTER, register_body(session_id=session_id))
    assert first.status_code == 201 and first.json()["replacedSession"] is True
    before = snapshot_rows()
    # available slots are dynamic: they are not part of what a replay must repeat
    again = api.post(wire.SESSION_REGISTER, register_body(session_id=session_id, availableSlots=0))
    assert again.status_code == 200
    assert without_timing(again.json()) == without_timing(first.json())
    assert snapshot_rows() == before


@pytest.mark.parametrize(
    "changes",
    [
        {"capabilities": {**BASE_SNAPSHOT, "cpuCount": 64}},
        {"maxConcurrentRuns": 3},
        {"softwareVersion": "test/2"},
    ],
    ids=["capabilities", "max-concurrency", "software-version"],
)
def test_same_session_with_other_content_is_a_conflict_audited_once(client, changes):
    worker = enrolled_worker()
    api = SignedClient(client, worker)
    session_id = uuid7()
    assert api.post(wire.SESSION_REGISTER, register_body(session_id=session_id)).status_code == 201
    sessions_before = list(WorkerSession.objects.order_by("pk").values())
    answer = api.post(wire.SESSION_REGISTER, register_body(session_id=session_id, **changes))
    assert answer.status_code == 409
    assert answer.json()["code"] == "session_replay_conflict" and answer.json()["field"] == "sessionId"
    assert list(WorkerSession.objects.order_by("pk").values()) == sessions_before
    events = Event.objects.filter(kind="session.replay_conflict")
    assert [(e.worker_id, e.session_id, e.data) for e in events] == [
        (worker.worker_id, session_id, {"reason": "content_differs"})
    ]


def test_another_workers_session_id_is_a_conflict_that_does_not_name_it():
    owner, intruder = enrolled_worker(), enrolled_worker()
    taken = register(owner)
    with pytest.raises(DomainError) as refused:
        register(intruder, session_id=taken.session_id)
    assert refused.value.code == "session_replay_conflict"
    event = Event.objects.get(kind="session.replay_conflict")
    assert (event.worker_id, event.session_id, event.data) == (
        intruder.worker_id,
        None,
        {"reason": "other_worker"},
    )
    assert not WorkerSession.objects.filter(worker_id=intruder.worker_id).exists()


def test_replacement_raises_generation_and_version_and_fences_the_old_session_atomically():
    worker = enrolled_worker()
    first = register(worker)
    session_heartbeat(
        worker_id=worker.worker_id,
        session_id=first.session_id,
        generation=1,
        expected_version=0,
        available_slots=1,
    )  # version 1
    second = register(worker)
    old = WorkerSession.objects.get(pk=first.session_id)
    assert (old.state, old.end_reason, old.available_slots, old.version) == ("fenced", "superseded", 0, 2)
    assert (
        old.ended_at == WorkerSession.objects.get(pk=second.session_id).registered_at
    )  # one transaction's clock
    assert (second.generation, second.version) == (2, 3)
    third = register(worker)
    assert (third.generation, third.version) == (3, 5)
    assert [s.pk for s in live(worker)] == [third.session_id]
    kinds = list(
        Event.objects.filter(worker_id=worker.worker_id, kind__startswith="session.")
        .order_by("pk")
        .values_list("kind", flat=True)
    )
    assert kinds == [
        "session.registered",
        "session.fenced",
        "session.registered",
        "session.replaced",
        "session.fenced",
        "session.registered",
        "session.replaced",
    ]


def test_replacement_settles_the_old_sessions_leases_started_lost_unstarted_requeued():
    worker = enrolled_worker()
    first = register(worker, max_concurrent=2)
    started_run = enqueue(make_revision(command="echo started"))
    waiting_run = enqueue(make_revision(command="echo waiting"))
    held = claim(first, 2)
    assert len(held) == 2
    starting({offer.run_id: offer for offer in held}[started_run.pk])

    register(worker)

    leases = {lease.run_id: lease for lease in RunDispatchLease.objects.all()}
    assert {(lease.state, lease.release_reason) for lease in leases.values()} == {
        ("released", "session_replaced")
    }
    assert RunAttempt.objects.get(run=started_run).state == "lost"
    assert Run.objects.get(pk=started_run.pk).state == "failed"  # lost_retry=never: the run fails
    waiting = RunAttempt.objects.get(run=waiting_run)
    assert (waiting.state, waiting.session_id, waiting.worker_id) == ("claimed", None, None)
    fenced = Event.objects.get(kind="session.fenced", session_id=first.session_id)
    assert fenced.data == {"reason": "superseded", "generation": 1, "settled_leases": 2}


def test_a_lapsed_session_is_expired_by_the_next_registration_not_taken_over(client, protocol_settings):
    protocol_settings(TAKEOVERS_PER_MINUTE=1)
    worker = enrolled_worker()
    api = SignedClient(client, worker)
    first = register(worker)
    register(worker)  # one takeover: the limit is reached
    second = live(worker)[0]
    WorkerSession.objects.filter(pk=second.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
    answer = api.post(wire.SESSION_REGISTER, register_body())
    assert answer.status_code == 201, answer.json()
    assert answer.json()["replacedSession"] is False and answer.json()["generation"] == 3
    lapsed = WorkerSession.objects.get(pk=second.pk)
    assert (lapsed.state, lapsed.end_reason) == ("expired", "lease_expired")
    assert Event.objects.filter(kind="session.expired", session_id=second.pk).count() == 1
    assert WorkerSession.objects.get(pk=first.session_id).state == "fenced"


def test_takeover_storm_is_limited_with_429_an_audit_event_and_nothing_else_written(
    client, protocol_settings
):
    protocol_settings(TAKEOVERS_PER_MINUTE=3)
    worker = enrolled_worker()
    api = SignedClient(client, worker)
    register(worker)  # a first registration is not a takeover
    for _ in range(3):
        assert api.post(wire.SESSION_REGISTER, register_body()).status_code == 201
    current = live(worker)[0]
    sessions_before = list(WorkerSession.objects.order_by("pk").values())

    answer = api.post(wire.SESSION_REGISTER, register_body())

    assert answer.status_code == 429
    assert answer.json()["code"] == "session_takeover_limited"
    assert 1 <= int(answer["Retry-After"]) <= 60
    assert list(WorkerSession.objects.order_by("pk").values()) == sessions_before
    assert [s.pk for s in live(worker)] == [current.pk]
    limited = Event.objects.filter(kind="session.takeover_limited")
    assert limited.count() == 1
    assert limited.get().data == {"limit": 3, "retry_after_s": int(answer["Retry-After"])}

    # a minute later (moved by the audit rows' own clock) the worker may take over again
    Event.objects.filter(kind="session.replaced").update(created_at=db_now() - timedelta(seconds=61))
    again = api.post(wire.SESSION_REGISTER, register_body())
    assert again.status_code == 201 and again.json()["replacedSession"] is True


def test_takeover_limit_retry_after_counts_down_from_the_oldest_replacement(protocol_settings):
    protocol_settings(TAKEOVERS_PER_MINUTE=2)
    worker = enrolled_worker()
    register(worker)
    register(worker)
    register(worker)
    now = db_now()
    oldest, newest = Event.objects.filter(kind="session.replaced").order_by("pk")
    Event.objects.filter(pk=oldest.pk).update(created_at=now - timedelta(seconds=45))
    with pytest.raises(DomainError) as refused:
        register(worker)
    assert refused.value.code == "session_takeover_limited"
    assert 14 <= refused.value.retry_after <= 16


def test_registrations_after_offline_are_not_takeovers(protocol_settings):
    protocol_settings(TAKEOVERS_PER_MINUTE=1)
    worker = enrolled_worker()
    for generation in range(1, 5):
        session = register(worker)
        assert session.generation == generation
        session_offline(
            worker_id=worker.worker_id,
            session_id=session.session_id,
            generation=session.generation,
            expected_version=session.version,
        )
    assert not Event.objects.filter(kind__in=["session.replaced", "session.takeover_limited"]).exists()


def test_operator_drain_survives_a_restart_and_undrain_lets_the_next_session_online():
    worker = enrolled_worker()
    register(worker)
    worker_drain(worker_id=worker.worker_id, actor="ops")
    restarted = register(worker)
    stored = WorkerSession.objects.get(pk=restarted.session_id)
    assert (stored.state, stored.available_slots, stored.drained_by) == ("draining", 0, "operator")
    registered = Event.objects.get(kind="session.registered", session_id=stored.pk)
    assert registered.data == {"generation": 2, "replaced": True, "draining": True}
    worker_undrain(worker_id=worker.worker_id, actor="ops")
    assert register(worker).generation == 3
    assert live(worker)[0].state == "online"


def test_a_workers_own_drain_does_not_outlive_its_process():
    worker = enrolled_worker()
    first = register(worker)
    session_drain(worker_id=worker.worker_id, session_id=first.session_id, generation=1, expected_version=0)
    restarted = register(worker)
    assert WorkerSession.objects.get(pk=restarted.session_id).state == "online"


def test_revocation_survives_a_restart(django_capture_on_commit_callbacks, client):
    worker = enrolled_worker()
    register(worker)
    with django_capture_on_commit_callbacks(execute=True):
        worker_revoke(worker_id=worker.worker_id, actor="ops")
    before = snapshot_rows()
    with pytest.raises(DomainError) as refused:
        register(worker)
    assert (refused.value.code, refused.value.status) == ("worker_revoked", 403)
    answer = SignedClient(client, worker).post(wire.SESSION_REGISTER, register_body())
    assert (answer.status_code, answer.json()["code"]) == (401, "credential_revoked")
    assert snapshot_rows() == before


@pytest.mark.parametrize(
    ("changes", "status", "code", "field"),
    [
        ({"sessionId": "4f9a0d52-7a4e-4c1e-9a54-2f7b3c1f0a11"}, 400, "session_id_invalid", "sessionId"),
        ({"availableSlots": 3}, 422, "slots_exceed_maximum", "availableSlots"),
        ({"maxConcurrentRuns": 0}, 400, "validation_failed", "maxConcurrentRuns"),
        ({"maxConcurrentRuns": 257}, 400, "validation_failed", "maxConcurrentRuns"),
        ({"protocolVersion": 2}, 400, "validation_failed", "protocolVersion"),
        ({"softwareVersion": "has space"}, 400, "validation_failed", "softwareVersion"),
        ({"capabilities": {**BASE_SNAPSHOT, "arch": 7}}, 422, "capabilities_invalid", "capabilities.arch"),
    ],
)
def test_bad_registration_input_is_a_4xx_naming_the_field_and_writes_nothing(
    client, changes, status, code, field
):
    worker = enrolled_worker()
    before = snapshot_rows()
    answer = SignedClient(client, worker).post(wire.SESSION_REGISTER, register_body(**changes))
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (status, code, field)
    assert snapshot_rows() == before


def test_capabilities_digest_is_canonical_so_key_order_does_not_matter():
    worker = enrolled_worker()
    session = register(worker)
    reordered = snapshot(**dict(reversed(list(BASE_SNAPSHOT.items()))))
    again = register(worker, session_id=session.session_id, snap=reordered)
    assert (again.generation, again.version) == (1, 0)
    assert WorkerSession.objects.count() == 1


def test_replay_of_a_session_in_every_ended_state_is_refused_with_its_code():
    worker = enrolled_worker()
    fenced = register(worker)
    offline = register(worker)
    session_offline(
        worker_id=worker.worker_id,
        session_id=offline.session_id,
        generation=2,
        expected_version=offline.version,
    )
    expired = register(worker)
    WorkerSession.objects.filter(pk=expired.session_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )
    sweep_expired_sessions()
    for ended, code in (
        (fenced, "session_superseded"),
        (offline, "session_offline"),
        (expired, "session_expired"),
    ):
        with pytest.raises(DomainError) as refused:
            register(worker, session_id=ended.session_id)
        assert refused.value.code == code
    assert SessionState.ONLINE not in set(WorkerSession.objects.values_list("state", flat=True))
