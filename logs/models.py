"""Job output: live log chunks, one stored log object per ended attempt, and artifacts (docs/logs.md).

While an attempt runs, each accepted chunk is a :class:`LogChunk` row (the worker's sequence
number, stream and monotonic offset, and the stored bytes at their position in the attempt's
combined log). When the attempt has ended, compaction writes the combined bytes as one object
through Django's storage API (``STORAGES["output"]``, the filesystem under the var dir by
default) and deletes the rows; :class:`AttemptLog` keeps the per-attempt state and, after
compaction, the index of stream segments. Artifacts are stored objects too; their parts are rows
until the last one arrives and the checksum is verified.
"""

from __future__ import annotations

from django.db import models

from core.lookups import one_of
from runs.models import Run, RunAttempt


class AttemptLog(models.Model):
    """The log of one attempt: what has been stored, and what the next chunk must continue."""

    attempt = models.OneToOneField(RunAttempt, primary_key=True, on_delete=models.CASCADE, related_name="log")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    #: The sequence number the next new chunk carries (chunks are numbered from 1).
    next_seq = models.PositiveIntegerField(default=1)
    #: Bytes stored in the combined log: the position of the next stored byte.
    stored_bytes = models.PositiveBigIntegerField(default=0)
    #: {stream: the agent's offset just after the last byte received of that stream}.
    stream_ends = models.JSONField(default=dict)
    #: {stream: whether the stored bytes of that stream end with a newline} (markers start a line).
    stream_newline = models.JSONField(default=dict)
    #: {stream: the last stored bytes of that stream, latin-1, ≤ longest secret − 1}: a secret
    #: split across two chunks is still masked (docs/logs.md, Secrets).
    stream_tails = models.JSONField(default=dict)
    truncated = models.BooleanField(default=False)
    #: Backpressure window (the database clock): its start and the bytes accepted in it.
    window_started_at = models.DateTimeField(null=True, blank=True)
    window_bytes = models.PositiveBigIntegerField(default=0)
    #: Set by compaction: the stored object and its index ``[[position, length, stream], …]``.
    object_name = models.CharField(max_length=300, blank=True, default="")
    index = models.JSONField(default=list)
    compacted_at = models.DateTimeField(null=True, blank=True)
    #: When the retention sweep deletes the log (set once the attempt has ended).
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["compacted_at"], name="attemptlog_compacted_idx"),
            models.Index(fields=["expires_at"], name="attemptlog_expires_idx"),
        ]

    def __str__(self) -> str:
        return f"log of {self.attempt_id}"


class LogChunk(models.Model):
    """One segment (one stream's bytes) of an accepted chunk of a live log, until compaction."""

    attempt = models.ForeignKey(RunAttempt, on_delete=models.CASCADE, related_name="log_chunks")
    #: The worker's sequence number, and the segment's place in that chunk.
    seq = models.PositiveIntegerField()
    part = models.PositiveSmallIntegerField(default=0)
    stream = models.CharField(max_length=8)
    #: The agent's monotonic offset of the chunk's first byte within its stream.
    offset = models.PositiveBigIntegerField(default=0)
    #: Position of the first stored byte in the attempt's combined log.
    position = models.PositiveBigIntegerField()
    #: Stored bytes (``len(data)``: markers included, secrets masked).
    size = models.PositiveIntegerField()
    data = models.BinaryField()
    #: SHA-256 of the whole chunk as sent (every segment's stream, offset and bytes; kept on part 0):
    #: an exact replay matches it.
    sent_sha256 = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["attempt", "position"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "seq", "part"], name="logchunk_seq_unique"),
            models.CheckConstraint(
                condition=one_of("stream", ["stdout", "stderr"]), name="logchunk_stream_valid"
            ),
        ]
        indexes = [models.Index(fields=["attempt", "position"], name="logchunk_position_idx")]


class ArtifactState(models.TextChoices):
    RECEIVING = "receiving"
    STORED = "stored"


class Artifact(models.Model):
    """One declared output file of an attempt, uploaded under the attempt's run lease."""

    id = models.BigAutoField(primary_key=True)
    attempt = models.ForeignKey(RunAttempt, on_delete=models.CASCADE, related_name="artifacts")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    #: Path relative to the job's work directory, "/"-separated.
    name = models.CharField(max_length=300)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=ArtifactState.choices, default=ArtifactState.RECEIVING)
    received_bytes = models.PositiveBigIntegerField(default=0)
    storage_name = models.CharField(max_length=400, blank=True, default="")
    created_at = models.DateTimeField()
    stored_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "name"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "name"], name="artifact_name_unique"),
            models.CheckConstraint(
                condition=one_of("state", ArtifactState.values), name="artifact_state_valid"
            ),
        ]
        indexes = [models.Index(fields=["expires_at"], name="artifact_expires_idx")]

    def __str__(self) -> str:
        return self.name


class ArtifactPart(models.Model):
    """One received part of an artifact still being uploaded (deleted once it is stored)."""

    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="parts")
    offset = models.PositiveBigIntegerField()
    data = models.BinaryField()

    class Meta:
        ordering = ["artifact", "offset"]
        constraints = [
            models.UniqueConstraint(fields=["artifact", "offset"], name="artifactpart_offset_unique")
        ]
