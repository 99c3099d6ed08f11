"""Operator API shapes for placement: previews and candidate pages (camelCase, read-only)."""

from rest_framework import serializers


class LiveWorkerRowSerializer(serializers.Serializer):
    workerId = serializers.UUIDField(source="worker.worker_id")
    workerName = serializers.CharField(source="worker.worker_name")
    freeSlots = serializers.IntegerField(source="worker.free_slots")
    score = serializers.IntegerField()


class PreviewRowSerializer(LiveWorkerRowSerializer):
    eligible = serializers.BooleanField(help_text="true if this worker would take a run of the revision now")
    category = serializers.CharField(
        allow_null=True, help_text="first mismatch, or capacity; null if it would take it"
    )


class PreviewSerializer(serializers.Serializer):
    revisionId = serializers.UUIDField()
    placement = serializers.JSONField(help_text="the normalised PlacementSpec pinned by the revision")
    liveWorkers = serializers.IntegerField(help_text="live workers considered (at most 1,024)")
    eligible = serializers.IntegerField(help_text="live workers that would take a run now")
    summary = serializers.JSONField(
        allow_null=True, help_text="{category: live workers} when none would take it ({} = none live)"
    )
    workers = PreviewRowSerializer(many=True, help_text="at most 64: takers first by rank, then the others")
    truncated = serializers.BooleanField()


class CandidatePageSerializer(serializers.Serializer):
    runId = serializers.UUIDField()
    candidates = LiveWorkerRowSerializer(many=True, help_text="at most 64, by score, free slots, worker id")
    nextAfter = serializers.CharField(allow_null=True, help_text="pass as ?after= for the next page")
