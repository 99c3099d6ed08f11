"""Outage-aware expiry (docs/leases.md, Outages): lapses while the control plane could not serve are
excused — not swept, not refused — until the grace window after it serves again has passed; a
worker that is really gone is settled once the window is over. Stranded attempts are settled once.

The liveness row is beaten through the real write path (``actions.liveness.liveness_beat``) and
its times are moved on the database clock to stage an outage of a given length; sweeps and fences
run for real on the test database.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from actions.leases.expiry import sweep_expired_leases, sweep_stranded_attempts
from actions.liveness import liveness_beat
from actions.sessions.expiry import sweep_expired_sessions
from actions.sessions.heartbeat import session_heartbeat, session_keep_alive, sessions_keep_alive
from audit.liveness import SERVING, expiry_cutoff
from audit.models import ControlPlaneBeat
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import Run
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, renew, start
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db

GRACE = 20.0
OUTAGE_AFTER = 6.0


@pytest.fixture(autouse=True)
def _timings(protocol_settings):
    protocol_settings(OUTAGE_GRACE_SECONDS=GRACE, OUTAGE_AFTER_SECONDS=OUTAGE_AFTER, DISPATCH_HOLD_SECONDS=0)


def stage_outage(*, began_seconds_ago: float, recovered_seconds_ago: float | None) -> None:
    """The control plane beat until ``began_seconds_ago``; then nothing until
    ``recovered_seconds_ago`` (None: still down). Uses the real beat for the recovery."""
    liveness_beat()
    now = db_now()
    began = now - timedelta(seconds=began_seconds_ago)
    earlier = began - timedelta(hours=1)
    ControlPlaneBeat.objects.filter(name=SERVING).update(beat_at=began, serving_since=earlier)
    if recovered_seconds_ago is not None:
        assert recovered_seconds_ago < began_seconds_ago - OUTAGE_AFTER
        liveness_beat()  # the first beat after the gap records the outage
        recovered = now - timedelta(seconds=recovered_seconds_ago)
        ControlPlaneBeat.objects.filter(name=SERVING).update(serving_since=recovered)
        row = ControlPlaneBeat.objects.get(name=SERVING)
        assert row.outage_began_at == began


def lapse(held, session, seconds_ago: float) -> None:
    """The worker's run lease and session lease both ran out ``seconds_ago`` (database clock)."""
    past = db_now() - timedelta(seconds=seconds_ago)
    RunDispatchLease.objects.filter(attempt_id=held.attempt_id, state="leased").update(expires_at=past)
    WorkerSession.objects.filter(pk=session.session_id).update(lease_expires_at=past)


def running_lease():
    session = register(enrolled_worker())
    enqueue(make_revision(max_attempts=2, lost_retry="idempotent"))
    return session, start(claim_one(session))


def test_a_lease_and_session_that_lapsed_during_the_outage_survive_a_heartbeat_and_renewal_in_grace():
    session, held = running_lease()
    stage_outage(began_seconds_ago=60, recovered_seconds_ago=2)
    lapse(held, session, seconds_ago=30)  # inside the outage
    assert sweep_expired_sessions() == 0 and sweep_expired_leases() == 0
    view = session_heartbeat(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=session.version,
        available_slots=2,
    )
    assert view.session.lease_expires_at > db_now()
    renewed = renew(held)
    assert renewed.status == "renewed" and renewed.lease.expires_at > db_now()
    complete(held)
    assert Run.objects.get(pk=held.run_id).state == "succeeded"


def test_a_worker_that_does_not_come_back_is_settled_once_the_grace_window_passed():
    session, held = running_lease()
    stage_outage(began_seconds_ago=60, recovered_seconds_ago=GRACE - 5)
    lapse(held, session, seconds_ago=30)
    assert sweep_expired_sessions() == 0 and sweep_expired_leases() == 0  # window still open
    ControlPlaneBeat.objects.filter(name=SERVING).update(
        serving_since=db_now() - timedelta(seconds=GRACE + 1)
    )
    assert expiry_cutoff(db_now()) >= db_now() - timedelta(seconds=1)
    assert sweep_expired_sessions() == 1  # the session expired; it settled its lease with it
    lease = RunDispatchLease.objects.get(attempt_id=held.attempt_id)
    assert (lease.state, lease.release_reason) == ("released", "session_expired")
    with pytest.raises(DomainError) as refused:
        renew(held)
    assert refused.value.code == "session_expired"


def test_while_no_replica_serves_nothing_that_lapsed_since_the_last_beat_is_settled():
    session, held = running_lease()
    stage_outage(began_seconds_ago=40, recovered_seconds_ago=None)
    lapse(held, session, seconds_ago=10)  # after the last beat
    assert sweep_expired_sessions() == 0 and sweep_expired_leases() == 0
    other_session, other = running_lease()
    lapse(other, other_session, seconds_ago=50)  # before the outage began: a real lapse
    assert sweep_expired_sessions() == 1
    assert RunDispatchLease.objects.get(attempt_id=other.attempt_id).state == "released"
    assert RunDispatchLease.objects.get(attempt_id=held.attempt_id).state == "leased"


def test_a_lapse_before_the_outage_is_refused_even_inside_the_grace_window():
    session, held = running_lease()
    stage_outage(began_seconds_ago=60, recovered_seconds_ago=2)
    lapse(held, session, seconds_ago=90)
    with pytest.raises(DomainError) as refused:
        renew(held)
    assert refused.value.code == "session_expired"
    assert sweep_expired_sessions() == 1


def test_without_an_outage_a_lapsed_lease_is_refused_and_swept_as_before():
    session, held = running_lease()
    liveness_beat()
    RunDispatchLease.objects.filter(attempt_id=held.attempt_id).update(
        expires_at=db_now() - timedelta(seconds=1)
    )
    with pytest.raises(DomainError) as refused:
        renew(held)
    assert refused.value.code == "lease_expired"
    assert sweep_expired_leases() == 1


def test_a_started_attempt_whose_lease_row_vanished_is_settled_once():
    session, held = running_lease()
    RunDispatchLease.objects.filter(attempt_id=held.attempt_id).delete()  # an out-of-band delete
    assert sweep_stranded_attempts() == 1
    attempt = held.attempt()
    assert (attempt.state, attempt.outcome_reason) == ("lost", "lease_missing")
    assert Run.objects.get(pk=held.run_id).state == "retry_wait"
    assert sweep_stranded_attempts() == 0


def test_a_started_attempt_whose_lease_was_settled_out_of_band_is_settled_once():
    session, held = running_lease()
    RunDispatchLease.objects.filter(attempt_id=held.attempt_id).update(
        state="released", release_reason="lease_expired", ended_at=db_now()
    )
    assert sweep_stranded_attempts() == 1
    assert held.attempt().state == "lost"
    assert sweep_stranded_attempts() == 0
    other_session, other = running_lease()  # a healthy running attempt is left alone
    assert sweep_stranded_attempts() == 0
    assert other.attempt().state == "running"


def test_a_second_outage_inside_the_first_ones_grace_window_keeps_the_first_lapses_excused():
    session, held = running_lease()
    stage_outage(began_seconds_ago=60, recovered_seconds_ago=40)  # grace open until 20 s ago + ...
    first_began = ControlPlaneBeat.objects.get(name=SERVING).outage_began_at
    lapse(held, session, seconds_ago=50)  # during the first outage, not renewed since
    # the beats stop again 35 s ago (inside the first grace window: 40 - 35 < GRACE) and resume now
    ControlPlaneBeat.objects.filter(name=SERVING).update(beat_at=db_now() - timedelta(seconds=35))
    liveness_beat()
    assert ControlPlaneBeat.objects.get(name=SERVING).outage_began_at == first_began
    assert sweep_expired_sessions() == 0 and sweep_expired_leases() == 0
    assert renew(held).status == "renewed"


def test_a_waiting_claims_keep_alive_in_the_grace_window_excuses_a_lapse_during_the_outage():
    """The waiting claim (the agent's default long poll) keeps its session like a heartbeat does:
    one keep-alive and the hub's batch keep-alive both extend a lease that lapsed in the outage."""
    session, held = running_lease()
    other, other_held = running_lease()
    stage_outage(began_seconds_ago=60, recovered_seconds_ago=2)
    lapse(held, session, seconds_ago=30)  # inside the outage
    lapse(other_held, other, seconds_ago=30)
    view = session_keep_alive(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=session.generation
    )
    assert view.session.lease_expires_at > db_now()
    assert sessions_keep_alive(sessions=[(other.session_id, other.generation)], tick=1) == 1
    assert WorkerSession.objects.get(pk=other.session_id).lease_expires_at > db_now()
