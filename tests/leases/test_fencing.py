"""Every stale-token and old-session path is refused over signed HTTP and writes nothing
(ADR-0012 §2–§3, docs/sessions.md, fail-closed matrix): each lease endpoint × each way a caller can be
out of date."""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest

from actions.sessions.shutdown import session_operator_offline
from actions.workers import worker_revoke
from audit.models import Event
from core.db import db_now
from leases.models import RunDispatchLease
from protocol import wire
from runs.models import Run, RunAttempt
from tests.helpers import SignedClient, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, expire_lease, release, start
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db

ENDPOINTS = ["claim", "starting", "running", "start_failed", "renew", "release", "complete"]


def rows():
    return (
        list(RunDispatchLease.objects.order_by("pk").values()),
        list(RunAttempt.objects.order_by("pk").values()),
        list(Run.objects.order_by("pk").values()),
        list(WorkerSession.objects.order_by("pk").values()),
        Event.objects.count(),
    )


def body(
    endpoint: str,
    *,
    session_id,
    generation: int,
    attempt_id,
    lease_generation: int,
    token: str,
    offer_id,
    version: int,
) -> tuple[str, dict]:
    fence = {"sessionId": str(session_id), "generation": generation}
    lease = {**fence, "attemptId": str(attempt_id), "leaseGeneration": lease_generation, "leaseToken": token}
    ack = {**lease, "offerId": str(offer_id), "leaseVersion": version}
    return {
        "claim": (wire.CLAIM, {**fence, "offers": [{"offerId": str(offer_id), "leaseToken": token}]}),
        "starting": (wire.LEASE_STARTING, ack),
        "running": (
            wire.LEASE_RUNNING,
            {**ack, "pid": 4242, "pgid": 4242, "executorHandle": "pid=4242 pgid=4242"},
        ),
        "start_failed": (wire.LEASE_START_FAILED, {**ack, "reason": "executor_start_failed"}),
        "renew": (wire.LEASE_RENEW, {**lease, "leaseVersion": version}),
        "release": (wire.LEASE_RELEASE, {**lease, "leaseVersion": version}),
        "complete": (
            wire.LEASE_COMPLETE,
            {
                **lease,
                "sequence": 1,
                "outcome": "succeeded",
                "exitCode": 0,
                "stdoutTail": "",
                "stderrTail": "",
            },
        ),
    }[endpoint]


@pytest.fixture
def world(client, protocol_settings):
    """A worker whose session runs an attempt; a second worker with its own running attempt."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)
    worker = enrolled_worker()
    session = register(worker)
    revision = make_revision()
    enqueue(revision), enqueue(revision)
    held = start(claim_one(session))
    other_worker = enrolled_worker()
    other_session = register(other_worker)
    other = start(claim_one(other_session))
    return {
        "api": SignedClient(client, worker),
        "other_api": SignedClient(client, other_worker),
        "worker": worker,
        "session": session,
        "held": held,
        "other_session": other_session,
        "other": other,
    }


def _args(world, **changes):
    held = world["held"]
    args = dict(
        session_id=held.session.session_id,
        generation=held.session.generation,
        attempt_id=held.attempt_id,
        lease_generation=held.lease_generation,
        token=held.ticket.token,
        offer_id=held.ticket.offer_id,
        version=held.lease_version,
    )
    return {**args, **changes}


def fault_wrong_token(world):
    return (
        world["api"],
        _args(world, token=secrets.token_urlsafe(32)),
        {"claim": "lease_offer_conflict"}.get,
        "lease_token_mismatch",
    )


def fault_superseded_session(world):
    register(world["worker"])  # a new process: generation 2 fences generation 1 and settles its lease
    return world["api"], _args(world), {}.get, "session_superseded"


def fault_other_generation(world):
    return world["api"], _args(world, generation=2), {}.get, "session_generation_mismatch"


def fault_expired_session(world):
    WorkerSession.objects.filter(pk=world["session"].session_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )
    return world["api"], _args(world), {}.get, "session_expired"


def fault_offline_session(world):
    session = world["session"]
    session_operator_offline(worker_id=session.worker.worker_id, force=True, actor="operator")
    return world["api"], _args(world), {}.get, "session_offline"


def fault_another_workers_lease(world):
    """The other worker presents this worker's attempt with its own live session."""
    mine = world["other_session"]
    args = _args(world, session_id=mine.session_id, generation=mine.generation)
    return world["other_api"], args, {}.get, "lease_unknown"


def fault_old_lease_generation(world):
    """The attempt was released and re-claimed (generation 2); generation 1's holder comes back."""
    session = world["session"]
    enqueue(make_revision())
    fresh = claim_one(session)  # an unstarted lease
    release(fresh)
    again = claim_one(session)
    assert again.attempt_id == fresh.attempt_id and again.lease_generation == 2
    args = _args(
        world,
        attempt_id=fresh.attempt_id,
        lease_generation=1,
        token=fresh.ticket.token,
        offer_id=fresh.ticket.offer_id,
        version=0,
    )
    return world["api"], args, {}.get, "lease_released"


def fault_lapsed_lease(world):
    expire_lease(world["held"].attempt_id)
    return world["api"], _args(world), {}.get, "lease_expired"


def fault_revoked_worker(world):
    worker_revoke(worker_id=world["worker"].worker_id)
    return world["api"], _args(world), {}.get, "credential_revoked"


FAULTS = [
    fault_wrong_token,
    fault_superseded_session,
    fault_other_generation,
    fault_expired_session,
    fault_offline_session,
    fault_another_workers_lease,
    fault_old_lease_generation,
    fault_lapsed_lease,
    fault_revoked_worker,
]


# Offer ids are per worker: another worker replaying this worker's offer id is simply a new
# claim of its own, not a path into this worker's lease.
CASES = [
    (endpoint, fault)
    for fault in FAULTS
    for endpoint in ENDPOINTS
    if not (endpoint == "claim" and fault is fault_another_workers_lease)
]


@pytest.mark.parametrize(
    ("endpoint", "fault"), CASES, ids=[f"{e}-{f.__name__.removeprefix('fault_')}" for e, f in CASES]
)
def test_every_stale_path_is_refused_and_writes_nothing(world, endpoint, fault):
    api, args, override, expected = fault(world)
    code = override(endpoint, expected)
    path, payload = body(endpoint, **args)
    before = rows()
    answer = api.post(path, payload)
    assert 400 <= answer.status_code < 500, answer.content
    assert answer.json()["code"] == code, answer.json()
    assert rows() == before


def test_the_holder_itself_is_not_refused(world):
    """The matrix's control: the same requests from the current holder go through."""
    api = world["api"]
    path, payload = body("renew", **_args(world))
    assert api.post(path, payload).status_code == 200
    path, payload = body("complete", **_args(world))
    assert api.post(path, payload).status_code == 200
