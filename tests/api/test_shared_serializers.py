"""``api.base.validated`` and ``api.base.represented`` use one serializer instance per class
(fields built once): the same validated data, the same refusals and the same JSON as a fresh
serializer per request."""

from __future__ import annotations

import datetime
import uuid
import zoneinfo
from types import SimpleNamespace

import pytest
from django.utils import timezone
from rest_framework import serializers

from api.base import represented, validated
from api.leases import serializers as lease_s
from api.workers import serializers as worker_s

FENCE = {"sessionId": str(uuid.uuid4()), "generation": 3}
LEASE = {**FENCE, "attemptId": str(uuid.uuid4()), "leaseGeneration": 1, "leaseToken": "t" * 43}
CASES = [
    (worker_s.HeartbeatSerializer, {**FENCE, "expectedVersion": 4, "availableSlots": 1}),
    (worker_s.HeartbeatSerializer, {**FENCE, "expectedVersion": "4", "availableSlots": 1}),
    (worker_s.HeartbeatSerializer, {**FENCE, "expectedVersion": 4}),
    (worker_s.HeartbeatSerializer, {**FENCE, "expectedVersion": 4, "availableSlots": 1, "x": 1}),
    (worker_s.HeartbeatSerializer, [FENCE]),
    (lease_s.ClaimSerializer, {**FENCE, "offers": [{"offerId": str(uuid.uuid4()), "leaseToken": "t" * 22}]}),
    (lease_s.ClaimSerializer, {**FENCE, "offers": [{"offerId": "nope", "leaseToken": "t" * 22}]}),
    (lease_s.ClaimSerializer, {**FENCE, "offers": []}),
    (
        lease_s.RunningAckSerializer,
        {
            **LEASE,
            "offerId": str(uuid.uuid4()),
            "leaseVersion": 0,
            "pid": 9,
            "pgid": None,
            "executorHandle": "h",
        },
    ),
    (lease_s.CompleteSerializer, {**LEASE, "sequence": 1, "outcome": "succeeded", "exitCode": 0}),
    (
        lease_s.CompleteSerializer,
        {**LEASE, "sequence": 1, "outcome": "won", "exitCode": 0, "stdoutTail": "\x00"},
    ),
]


def _fresh(serializer_class, data):
    serializer = serializer_class(data=data)
    try:
        serializer.is_valid(raise_exception=True)
    except serializers.ValidationError as exc:
        return "refused", exc.detail
    return "valid", serializer.validated_data


@pytest.mark.parametrize(("serializer_class", "data"), CASES)
def test_validated_gives_what_a_fresh_serializer_gives(serializer_class, data):
    for _ in range(2):  # the shared instance keeps nothing from one call to the next
        try:
            got = "valid", validated(serializer_class, SimpleNamespace(data=data))
        except serializers.ValidationError as exc:
            got = "refused", exc.detail
        assert got == _fresh(serializer_class, data)


def test_represented_gives_a_fresh_serializers_json_in_the_active_timezone():
    at = datetime.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    lease = {
        "attemptId": uuid.uuid4(),
        "offerId": uuid.uuid4(),
        "leaseGeneration": 2,
        "leaseVersion": 5,
        "expiresAt": at,
        "renewIntervalSeconds": 10,
    }
    out = {"status": "renewed", "lease": lease, "cancelRequested": False}
    assert represented(lease_s.AckOutSerializer, out) == lease_s.AckOutSerializer(out).data
    with timezone.override(zoneinfo.ZoneInfo("Asia/Shanghai")):
        shifted = represented(lease_s.AckOutSerializer, out)
        assert shifted == lease_s.AckOutSerializer(out).data
    assert shifted["lease"]["expiresAt"] == "2026-12-01T20:00:00.123456+08:00"
