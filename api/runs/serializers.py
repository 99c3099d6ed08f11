"""Operator API shapes: task revisions, runs, attempts (camelCase, strict input)."""

from __future__ import annotations

import json

from rest_framework import serializers

from api.base import StrictCharField, StrictIntegerField, StrictSerializer, StrictUUIDField
from runs.models import LostRetry
from runs.revisions import (
    EXECUTORS,
    MAX_ARTIFACT_FILE_BYTES,
    MAX_ARTIFACT_FILES,
    MAX_ENV,
    MAX_OUTPUT_PATH_CHARS,
    MAX_OUTPUT_PATHS,
    MAX_RETENTION_DAYS,
    RETRYABLE_OUTCOMES,
    OutputSpec,
    RevisionSpec,
)


class RetrySerializer(StrictSerializer):
    maxAttempts = StrictIntegerField(min_value=1, max_value=20, default=1)
    retryOn = serializers.ListField(
        child=serializers.ChoiceField(choices=RETRYABLE_OUTCOMES), max_length=2, default=list
    )
    lostRetry = serializers.ChoiceField(choices=LostRetry.values, default=LostRetry.NEVER)
    backoffSeconds = StrictIntegerField(min_value=1, max_value=86400, default=10)
    backoffMaxSeconds = StrictIntegerField(min_value=1, max_value=86400, default=300)
    lostAfterSeconds = StrictIntegerField(
        min_value=0,
        max_value=86400,
        required=False,
        allow_null=True,
        default=None,
        help_text="hard deadline past a run lease's expiry (docs/leases.md); null: the server default",
    )


class OutputsSerializer(StrictSerializer):
    """What the revision keeps of its attempts (docs/logs.md): secrets masked in the log,
    declared artifact globs and their limits, retention."""

    secretEnv = serializers.ListField(
        child=StrictCharField(max_length=64),
        max_length=MAX_ENV,
        default=list,
        help_text="env names masked in logs",
    )
    paths = serializers.ListField(
        child=StrictCharField(max_length=MAX_OUTPUT_PATH_CHARS),
        max_length=MAX_OUTPUT_PATHS,
        default=list,
        help_text="artifact globs relative to the job's work directory",
    )
    maxFiles = StrictIntegerField(min_value=1, max_value=MAX_ARTIFACT_FILES, default=16)
    maxFileBytes = StrictIntegerField(
        min_value=1, max_value=MAX_ARTIFACT_FILE_BYTES, default=16 * 1024 * 1024
    )
    maxTotalBytes = StrictIntegerField(
        min_value=1, max_value=MAX_ARTIFACT_FILES * MAX_ARTIFACT_FILE_BYTES, default=64 * 1024 * 1024
    )
    retentionDays = StrictIntegerField(min_value=1, max_value=MAX_RETENTION_DAYS, default=30)


class RevisionInSerializer(StrictSerializer):
    executor = serializers.ChoiceField(choices=EXECUTORS)
    command = StrictCharField(max_length=64 * 1024, trim_whitespace=False)
    timeoutSeconds = StrictIntegerField(min_value=1, max_value=7 * 24 * 3600)
    env = serializers.DictField(
        child=StrictCharField(max_length=1024, allow_blank=True, trim_whitespace=False),
        required=False,
        default=dict,
    )
    placement = serializers.JSONField(
        required=False, default=dict, help_text="PlacementSpec: {required: {...}, preferred: {labels: [...]}}"
    )
    retry = RetrySerializer(required=False)
    outputs = OutputsSerializer(required=False)

    def to_spec(self) -> RevisionSpec:
        data = self.validated_data
        retry = data.get("retry") or RetrySerializer(data={}).run_validation({})
        outputs = data.get("outputs") or OutputsSerializer(data={}).run_validation({})
        return RevisionSpec(
            executor=data["executor"],
            command=data["command"],
            timeout_seconds=data["timeoutSeconds"],
            env=data.get("env") or {},
            placement=data["placement"],
            max_attempts=retry["maxAttempts"],
            retry_on=tuple(retry["retryOn"]),
            lost_retry=retry["lostRetry"],
            retry_backoff_seconds=retry["backoffSeconds"],
            retry_backoff_max_seconds=retry["backoffMaxSeconds"],
            output=OutputSpec(
                secret_env=tuple(outputs["secretEnv"]),
                paths=tuple(outputs["paths"]),
                max_files=outputs["maxFiles"],
                max_file_bytes=outputs["maxFileBytes"],
                max_total_bytes=outputs["maxTotalBytes"],
                retention_days=outputs["retentionDays"],
            ),
            lost_after_seconds=retry.get("lostAfterSeconds"),
        )


class TaskInSerializer(RevisionInSerializer):
    name = StrictCharField(max_length=100)
    description = StrictCharField(max_length=200, required=False, default="", allow_blank=True)


class EnqueueSerializer(StrictSerializer):
    task = StrictCharField(max_length=100, required=False, help_text="task name: runs its newest revision")
    revisionId = StrictUUIDField(required=False)
    priority = StrictIntegerField(min_value=-100, max_value=100, default=0)

    def validate(self, attrs):
        if ("task" in attrs) == ("revisionId" in attrs):
            raise serializers.ValidationError({"task": ["give exactly one of task or revisionId"]})
        return attrs


class CancelSerializer(StrictSerializer):
    reason = StrictCharField(max_length=200, required=False, default="", allow_blank=True)


class RevisionOutSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    taskId = serializers.UUIDField(source="task_id")
    taskName = serializers.CharField(source="task.name")
    number = serializers.IntegerField()
    executor = serializers.CharField()
    timeoutSeconds = serializers.IntegerField(source="timeout_seconds")
    placementSha256 = serializers.CharField(source="placement_sha256")
    specSha256 = serializers.CharField(source="spec_sha256")
    maxAttempts = serializers.IntegerField(source="max_attempts")
    outputs = serializers.SerializerMethodField(help_text="secrets masked in logs, artifacts, retention")

    def get_outputs(self, revision) -> dict:
        return {
            "secretEnv": list(revision.secret_env),
            "paths": list(revision.output_paths),
            "maxFiles": revision.artifact_max_files,
            "maxFileBytes": revision.artifact_max_file_bytes,
            "maxTotalBytes": revision.artifact_max_total_bytes,
            "retentionDays": revision.output_retention_days,
        }


class TaskOutSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    description = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")


class RevisionDetailSerializer(RevisionOutSerializer):
    """A revision as stored. Environment *values* are not shown (they may hold secrets): names only."""

    command = serializers.CharField()
    envNames = serializers.SerializerMethodField()
    placement = serializers.SerializerMethodField(help_text="the normalised PlacementSpec")
    retryOn = serializers.JSONField(source="retry_on")
    lostRetry = serializers.CharField(source="lost_retry")
    lostAfterSeconds = serializers.IntegerField(source="effective_lost_after_seconds")
    createdAt = serializers.DateTimeField(source="created_at")

    def get_envNames(self, revision) -> list[str]:
        return sorted(revision.env)

    def get_placement(self, revision) -> dict:
        return json.loads(revision.placement)


class AttemptOutSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    number = serializers.IntegerField()
    state = serializers.CharField()
    workerName = serializers.CharField(source="worker.name", default=None, allow_null=True)
    leaseGeneration = serializers.IntegerField(source="lease_generation")
    exitCode = serializers.IntegerField(source="exit_code", allow_null=True)
    outcomeReason = serializers.CharField(source="outcome_reason")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    stdoutTail = serializers.CharField(source="stdout_tail")
    stderrTail = serializers.CharField(source="stderr_tail")


class RunOutSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    taskId = serializers.UUIDField(source="task_id")
    taskName = serializers.CharField(source="task.name")
    revisionId = serializers.UUIDField(source="revision_id")
    revisionNumber = serializers.IntegerField(source="revision.number")
    retryOf = serializers.UUIDField(
        source="retry_of_id", allow_null=True, help_text="the run this one retries"
    )
    state = serializers.CharField()
    priority = serializers.IntegerField()
    attemptCount = serializers.IntegerField(source="attempt_count")
    nextAttemptAt = serializers.DateTimeField(source="next_attempt_at", allow_null=True)
    cancelRequestedAt = serializers.DateTimeField(source="cancel_requested_at", allow_null=True)
    cancelReason = serializers.CharField(source="cancel_reason")
    exitCode = serializers.IntegerField(source="exit_code", allow_null=True)
    errorClass = serializers.CharField(source="error_class")
    placementSummary = serializers.JSONField(
        source="placement_summary", allow_null=True, help_text="why it waits: {category: live workers}"
    )
    placementCheckedAt = serializers.DateTimeField(source="placement_checked_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    scheduleId = serializers.UUIDField(
        source="schedule_fire.schedule_id", allow_null=True, help_text="the schedule whose fire started it"
    )
    scheduleFireAt = serializers.DateTimeField(
        source="schedule_fire.fire_at", allow_null=True, help_text="that fire's nominal time"
    )
    attempts = AttemptOutSerializer(many=True)


class CancelOutSerializer(serializers.Serializer):
    status = serializers.CharField()
    run = RunOutSerializer()
