"""Worker management API shapes (camelCase; ``docs/operators.md``)."""

from __future__ import annotations

from rest_framework import serializers

from api.base import StrictIntegerField, StrictSerializer


class LiveSessionSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="session.id")
    generation = serializers.IntegerField(source="session.generation")
    version = serializers.IntegerField(source="session.version")
    state = serializers.CharField(source="session.state")
    capacityUsed = serializers.IntegerField(source="capacity_used", help_text="active run leases held")
    maxConcurrentRuns = serializers.IntegerField(source="session.max_concurrent_runs")
    availableSlots = serializers.IntegerField(source="session.available_slots")
    heartbeatAgeSeconds = serializers.FloatField(
        source="heartbeat_age_seconds", help_text="seconds since the last heartbeat (database clock)"
    )
    leaseExpiresAt = serializers.DateTimeField(source="session.lease_expires_at")
    registeredAt = serializers.DateTimeField(source="session.registered_at")
    softwareVersion = serializers.CharField(source="session.software_version")
    protocolVersion = serializers.IntegerField(source="session.protocol_version")
    versionPolicy = serializers.ChoiceField(
        source="version_policy",
        choices=["current", "outdated", "unknown"],
        help_text="the agent's version against MIN_AGENT_VERSION and SUPPORTED_PROTOCOL_VERSIONS",
    )


class LiveSessionDetailSerializer(LiveSessionSerializer):
    capabilities = serializers.JSONField(help_text="the session's canonical capability snapshot")


class WorkerOutSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    description = serializers.CharField()
    state = serializers.CharField()
    drainRequestedAt = serializers.DateTimeField(source="drain_requested_at", allow_null=True)
    revokedAt = serializers.DateTimeField(source="revoked_at", allow_null=True)
    rotationRequired = serializers.BooleanField(source="rotation_required")
    createdAt = serializers.DateTimeField(source="created_at")
    liveSession = LiveSessionSerializer(source="live_facts", allow_null=True)


class ActiveAttemptSerializer(serializers.Serializer):
    attemptId = serializers.UUIDField(source="attempt_id")
    runId = serializers.UUIDField(source="run_id")
    attemptState = serializers.CharField(source="attempt.state")
    leaseGeneration = serializers.IntegerField(source="lease_generation")
    leaseExpiresAt = serializers.DateTimeField(source="expires_at")
    claimedAt = serializers.DateTimeField(source="claimed_at")


class WorkerDetailSerializer(WorkerOutSerializer):
    liveSession = LiveSessionDetailSerializer(source="live_facts", allow_null=True)
    activeAttempts = ActiveAttemptSerializer(source="active_attempts", many=True)


class WorkerInSerializer(StrictSerializer):
    name = serializers.CharField(max_length=64)
    description = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)


class EnrollmentTokenInSerializer(StrictSerializer):
    ttlSeconds = StrictIntegerField(min_value=60, max_value=30 * 24 * 3600, required=False)


class EnrollmentTokenOutSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="single use; shown only in this answer")
    workerId = serializers.UUIDField()
    expiresAt = serializers.DateTimeField()
    command = serializers.CharField(help_text="what to run on the machine")


class OfflineInSerializer(StrictSerializer):
    force = serializers.BooleanField(
        default=False, help_text="settle active run leases (started attempts lost)"
    )


class OperatorSessionSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    workerId = serializers.UUIDField(source="worker_id")
    workerName = serializers.CharField(source="worker.name")
    generation = serializers.IntegerField()
    version = serializers.IntegerField()
    state = serializers.CharField()
    endReason = serializers.CharField(source="end_reason")
    maxConcurrentRuns = serializers.IntegerField(source="max_concurrent_runs")
    availableSlots = serializers.IntegerField(source="available_slots")
    softwareVersion = serializers.CharField(source="software_version")
    protocolVersion = serializers.IntegerField(source="protocol_version")
    capabilitiesSha256 = serializers.CharField(source="capabilities_sha256")
    registeredAt = serializers.DateTimeField(source="registered_at")
    leaseExpiresAt = serializers.DateTimeField(source="lease_expires_at")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)


class OperatorSessionDetailSerializer(OperatorSessionSerializer):
    capabilities = serializers.SerializerMethodField()

    def get_capabilities(self, session) -> dict:
        return self.context["capabilities"]


class EventOutSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    createdAt = serializers.DateTimeField(source="created_at")
    kind = serializers.CharField()
    actorType = serializers.CharField(source="actor_type")
    actor = serializers.CharField()
    workerId = serializers.UUIDField(source="worker_id", allow_null=True)
    sessionId = serializers.UUIDField(source="session_id", allow_null=True)
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    attemptId = serializers.UUIDField(source="attempt_id", allow_null=True)
    leaseId = serializers.UUIDField(source="lease_id", allow_null=True)

    def get_fields(self):
        # ``data`` is also the name of Serializer's output property: declared here, not as a class attribute.
        fields = super().get_fields()
        fields["data"] = serializers.JSONField(
            help_text="low-cardinality facts; the acting operator's role as `role`"
        )
        return fields
