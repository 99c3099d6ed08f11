"""Wire shapes of the worker session endpoints (camelCase, strict: unknown keys are refused)."""

from __future__ import annotations

import re

from rest_framework import serializers

from api.base import StrictCharField, StrictIntegerField, StrictSerializer, StrictUUIDField
from protocol import capabilities as caps
from protocol import messages, wire
from protocol.errors import ProtocolError
from workers.sessions import MAX_CONCURRENT_RUNS, SessionView

VERSION_TEXT = r"[\x21-\x7e]{1,64}"


class CapabilitiesField(serializers.JSONField):
    """The capability snapshot: validated and canonicalised by ``protocol.capabilities`` (ADR-0012 §4).

    Every refusal — ``null`` included — surfaces as 422 ``capabilities_invalid`` or
    ``capabilities_too_large`` with the path inside the snapshot (``capabilities.gpus[0].memoryMiB``),
    so the agent and the server refuse exactly the same documents.
    """

    def run_validation(self, data=serializers.empty):
        if data is None:
            raise ProtocolError("capabilities_invalid", "must be an object", "capabilities")
        return super().run_validation(data)

    def to_internal_value(self, data):
        try:
            return caps.snapshot(data)
        except ProtocolError as exc:
            field = (
                f"capabilities.{exc.field}" if exc.field and exc.field != "capabilities" else "capabilities"
            )
            raise ProtocolError(exc.code, exc.message, field) from None


#: Session generations are stored as 64-bit integers; a larger number names no session (and is
#: out of range for the PostgreSQL functions that take it: a 500).
MAX_GENERATION = 2**63 - 1


class FenceSerializer(StrictSerializer):
    workerId = StrictUUIDField(required=False, help_text="optional; must equal the authenticated worker")
    sessionId = StrictUUIDField()
    generation = StrictIntegerField(min_value=1, max_value=MAX_GENERATION)


class RegisterSerializer(StrictSerializer):
    workerId = StrictUUIDField(required=False, help_text="optional; must equal the authenticated worker")
    sessionId = StrictUUIDField(help_text="a fresh UUIDv7 per process start")
    capabilities = CapabilitiesField()
    maxConcurrentRuns = StrictIntegerField(min_value=1, max_value=MAX_CONCURRENT_RUNS)
    availableSlots = StrictIntegerField(min_value=0, max_value=MAX_CONCURRENT_RUNS)
    softwareVersion = StrictCharField(max_length=64)
    protocolVersion = StrictIntegerField(min_value=1, max_value=1000)

    def validate_softwareVersion(self, value: str) -> str:
        if not re.fullmatch(VERSION_TEXT, value):
            raise serializers.ValidationError("1-64 printable ASCII characters without spaces")
        return value


class HeartbeatSerializer(FenceSerializer):
    expectedVersion = StrictIntegerField(min_value=0)
    availableSlots = StrictIntegerField(min_value=0, max_value=MAX_CONCURRENT_RUNS)


class TransitionSerializer(FenceSerializer):
    expectedVersion = StrictIntegerField(min_value=0)


class SessionOutSerializer(serializers.Serializer):
    """The session fence the worker presents next, and the timers the server sets."""

    workerId = serializers.UUIDField()
    sessionId = serializers.UUIDField()
    generation = serializers.IntegerField()
    version = serializers.IntegerField()
    state = serializers.CharField()
    maxConcurrentRuns = serializers.IntegerField()
    availableSlots = serializers.IntegerField()
    capabilitiesSha256 = serializers.CharField()
    leaseExpiresAt = serializers.DateTimeField()
    heartbeatIntervalSeconds = serializers.IntegerField()
    nextHeartbeatAt = serializers.DateTimeField()
    serverTime = serializers.DateTimeField()
    replacedSession = serializers.BooleanField()
    cancelRequested = serializers.ListField(child=serializers.UUIDField())
    rotationRequired = serializers.BooleanField()


def session_out(view: SessionView) -> messages.SessionAnswer:
    """The session answer (register, heartbeat, drain, offline, a waiting claim's ``session``),
    built as the wire has it (ids as text, times ``protocol.wire.timestamp``): what
    ``SessionOutSerializer``, which documents it, would write with UTC active, for a fraction of
    its CPU on the hottest call a worker makes (docs/performance.md, "Signed HTTP")."""
    session = view.session
    return {
        "workerId": str(session.worker_id),
        "sessionId": str(session.pk),
        "generation": session.generation,
        "version": session.version,
        "state": session.state,
        "maxConcurrentRuns": session.max_concurrent_runs,
        "availableSlots": session.available_slots,
        "capabilitiesSha256": session.capabilities_sha256,
        "leaseExpiresAt": wire.timestamp(session.lease_expires_at),
        "heartbeatIntervalSeconds": view.heartbeat_interval_seconds,
        "nextHeartbeatAt": wire.timestamp(view.next_heartbeat_at),
        "serverTime": wire.timestamp(view.server_time),
        "replacedSession": view.replaced_session,
        "cancelRequested": [str(attempt) for attempt in view.cancel_requested],
        "rotationRequired": view.rotation_required,
    }


class EnrollSerializer(StrictSerializer):
    token = StrictCharField(max_length=128)
    publicKey = StrictCharField(max_length=64, help_text="raw 32-byte Ed25519 public key, base64url")
    workerName = StrictCharField(max_length=64, required=False)
    agentVersion = StrictCharField(max_length=64, required=False)


class EnrollOutSerializer(serializers.Serializer):
    workerId = serializers.UUIDField()
    workerName = serializers.CharField()
    credentialId = serializers.CharField(help_text="the RFC 9421 keyid to sign with")


class RotateSerializer(StrictSerializer):
    workerId = StrictUUIDField(required=False, help_text="optional; must equal the authenticated worker")
    publicKey = StrictCharField(max_length=64)


class RotateOutSerializer(serializers.Serializer):
    credentialId = serializers.CharField()
    previousCredentialValidUntil = serializers.DateTimeField()
