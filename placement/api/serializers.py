from rest_framework import serializers


class PreviewRowSerializer(serializers.Serializer):
    workerId = serializers.UUIDField(source="worker.worker_id")
    workerName = serializers.CharField(source="worker.worker_name")
    eligible = serializers.BooleanField()
    score = serializers.IntegerField()
    freeSlots = serializers.IntegerField(source="worker.free_slots")
    category = serializers.CharField(allow_null=True, help_text="first mismatch, or capacity; null if it would take it")


class PreviewSerializer(serializers.Serializer):
    revisionId = serializers.UUIDField()
    placement = serializers.JSONField()
    workers = PreviewRowSerializer(many=True)
