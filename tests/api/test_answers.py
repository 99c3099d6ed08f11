"""The worker API's answers are built as the wire has them (``api.workers.serializers.session_out``,
``api.leases.serializers``: ids as text, times ``protocol.wire.timestamp``), without the output
serializers that document them in the OpenAPI schema. Those builders must write exactly what
the serializers would (with UTC active, as on the worker API), key for key and character for
character, over ids, generations up to 2**63 - 1, times with and without microseconds, in UTC,
in other offsets and naive, and cancellation lists; and they stay in UTC whatever timezone is
active."""

from __future__ import annotations

import datetime
import json
import uuid
import zoneinfo

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from actions.leases.completion import CompletionResult
from actions.leases.next_claim import NextClaim
from api.leases import serializers as lease_s
from api.workers import serializers as worker_s
from core.errors import DomainError
from leases.fence import AckResult
from leases.models import RunDispatchLease
from leases.offers import Offer
from protocol import wire
from workers.models import WorkerSession
from workers.sessions import SessionView

UTC = datetime.UTC
SHANGHAI = zoneinfo.ZoneInfo("Asia/Shanghai")
TIMES = [
    datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC),
    datetime.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC),
    datetime.datetime(2026, 12, 1, 23, 59, 59, 1, tzinfo=SHANGHAI),
    datetime.datetime(2027, 3, 1, 0, 0, 0, 500000, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
    datetime.datetime(2026, 6, 30, 8, 30, 0, 999999),  # naive: UTC, as DRF takes it with UTC active
]


def _rendered(data) -> bytes:
    return JSONRenderer().render(data)


def _session_view(at: datetime.datetime, generation: int, cancels: tuple[uuid.UUID, ...]) -> SessionView:
    session = WorkerSession(
        id=uuid.uuid4(),
        worker_id=uuid.uuid4(),
        generation=generation,
        version=generation + 3,
        state="draining" if generation % 2 else "online",
        capabilities_sha256="a" * 64,
        max_concurrent_runs=4,
        available_slots=generation % 5,
        lease_expires_at=at + datetime.timedelta(seconds=30),
    )
    return SessionView(
        session=session,
        server_time=at,
        replaced_session=bool(generation % 2),
        cancel_requested=cancels,
        rotation_required=not generation % 3,
    )


def _documented_session(view: SessionView) -> dict:
    """What ``SessionOutSerializer`` writes for ``view`` (the mapping the answer used to take)."""
    session = view.session
    return worker_s.SessionOutSerializer(
        {
            "workerId": session.worker_id,
            "sessionId": session.pk,
            "generation": session.generation,
            "version": session.version,
            "state": session.state,
            "maxConcurrentRuns": session.max_concurrent_runs,
            "availableSlots": session.available_slots,
            "capabilitiesSha256": session.capabilities_sha256,
            "leaseExpiresAt": session.lease_expires_at,
            "heartbeatIntervalSeconds": view.heartbeat_interval_seconds,
            "nextHeartbeatAt": view.next_heartbeat_at,
            "serverTime": view.server_time,
            "replacedSession": view.replaced_session,
            "cancelRequested": list(view.cancel_requested),
            "rotationRequired": view.rotation_required,
        }
    ).data


def _lease(at: datetime.datetime, generation: int) -> RunDispatchLease:
    return RunDispatchLease(
        attempt_id=uuid.uuid4(),
        offer_id=uuid.uuid4(),
        lease_generation=generation,
        version=generation * 2,
        expires_at=at,
    )


def _documented_lease(lease: RunDispatchLease, renew: int) -> dict:
    return {
        "attemptId": lease.attempt_id,
        "offerId": lease.offer_id,
        "leaseGeneration": lease.lease_generation,
        "leaseVersion": lease.version,
        "expiresAt": lease.expires_at,
        "renewIntervalSeconds": renew,
    }


@pytest.fixture
def steady_jitter(monkeypatch):
    """``next_heartbeat_at`` is jittered at each read: the same jitter for both sides."""
    monkeypatch.setattr("workers.sessions.random.uniform", lambda low, high: high / 3)


@pytest.mark.parametrize("at", TIMES)
@pytest.mark.parametrize("generation", [1, 2, 6, 2**63 - 1])
def test_the_session_answer_is_what_its_serializer_documents(steady_jitter, at, generation):
    cancels = tuple(uuid.uuid4() for _ in range(generation % 4))
    view = _session_view(at, generation, cancels)
    built = worker_s.session_out(view)
    with timezone.override(UTC):
        documented = _documented_session(view)
    assert built == documented
    assert _rendered(built) == _rendered(documented)
    assert list(built) == list(documented)  # the same key order, so the same bytes


@pytest.mark.parametrize("at", TIMES)
@pytest.mark.parametrize("status", ["claimed", "idempotent"])
def test_the_claim_and_ack_answers_are_what_their_serializers_document(at, status):
    leases = [_lease(at, n) for n in (1, 7, 2**31)]
    offers = [
        Offer(lease=lease, execution={"kind": "x", "n": 1}, status=status, renew_interval_seconds=5)
        for lease in leases
    ]
    with timezone.override(UTC):
        claim = lease_s.ClaimOutSerializer(
            {
                "offers": [
                    {"status": o.status, "lease": _documented_lease(o.lease, 5), "execution": o.execution}
                    for o in offers
                ],
                "pollAfterSeconds": 5,
            }
        ).data
        ack_result = AckResult(
            status="renewed", lease=leases[1], cancel_requested=True, renew_interval_seconds=15
        )
        ack = lease_s.AckOutSerializer(
            {"status": "renewed", "lease": _documented_lease(leases[1], 15), "cancelRequested": True}
        ).data
    assert _rendered(lease_s.claim_out(offers, 5)) == _rendered(claim)
    assert _rendered(lease_s.claim_out([], 2.5)) == _rendered({"offers": [], "pollAfterSeconds": 2.5})
    assert _rendered(lease_s.ack_out(ack_result)) == _rendered(ack)


def test_the_completion_answer_is_what_its_serializer_documents():
    result = CompletionResult(attempt_id=uuid.uuid4(), lease_generation=3, sequence=2, outcome="timed_out")
    documented = lease_s.CompleteOutSerializer(
        {
            "attemptId": result.attempt_id,
            "leaseGeneration": result.lease_generation,
            "sequence": result.sequence,
            "outcome": result.outcome,
        }
    ).data
    assert _rendered(lease_s.complete_out(result)) == _rendered(documented)


@pytest.mark.parametrize("at", TIMES[:2])
@pytest.mark.parametrize(
    "refused",
    [
        None,
        DomainError("session_draining", "the session is draining"),
        DomainError(
            "lease_offer_conflict", "claimed with another token", field="offers[0].offerId", details={"n": 1}
        ),
    ],
)
def test_the_completion_answer_with_its_next_claim_is_what_its_serializer_documents(at, refused):
    result = CompletionResult(attempt_id=uuid.uuid4(), lease_generation=1, sequence=1, outcome="succeeded")
    offers = [] if refused else [Offer(_lease(at, 1), {"kind": "x"}, "claimed", 5)]
    next_documented: dict = {
        "offers": [
            {"status": o.status, "lease": _documented_lease(o.lease, 5), "execution": o.execution}
            for o in offers
        ]
    }
    if refused:
        next_documented["refused"] = {"code": refused.code, "message": refused.message}
        if refused.field:
            next_documented["refused"] |= {"field": "next." + refused.field, "details": refused.details}
    with timezone.override(UTC):
        documented = lease_s.CompleteOutSerializer(
            {
                "attemptId": result.attempt_id,
                "leaseGeneration": result.lease_generation,
                "sequence": result.sequence,
                "outcome": result.outcome,
                "next": next_documented,
            }
        ).data
    built = lease_s.complete_out(result, NextClaim(offers, refused))
    assert _rendered(built) == _rendered(documented)


def test_answers_are_in_utc_whatever_timezone_is_active(steady_jitter):
    at = datetime.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
    view = _session_view(at, 2, ())
    with timezone.override(SHANGHAI):
        built = worker_s.session_out(view)
        lease = lease_s.lease_out(_lease(at, 1), 10)
    assert built["serverTime"] == "2026-12-01T12:00:00.123456Z"
    assert built["leaseExpiresAt"] == "2026-12-01T12:00:30.123456Z"
    assert lease["expiresAt"] == "2026-12-01T12:00:00.123456Z"


def test_timestamp_writes_rfc3339_in_utc():
    assert wire.timestamp(None) is None
    assert wire.timestamp(TIMES[0]) == "2026-12-01T12:00:00Z"
    assert wire.timestamp(TIMES[2]) == "2026-12-01T15:59:59.000001Z"
    assert wire.timestamp(TIMES[4]) == "2026-06-30T08:30:00.999999Z"
    parsed = datetime.datetime.fromisoformat(wire.timestamp(TIMES[3]))
    assert parsed == TIMES[3] and parsed.utcoffset() == datetime.timedelta(0)
    assert json.loads(_rendered({"t": wire.timestamp(TIMES[1])})) == {"t": "2026-12-01T12:00:00.123456Z"}
