"""Artifact upload under the run lease, part by part, each part one transaction (docs/logs.md,
Artifacts; ADR-0012 §3 for the fences)."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import timedelta

from core.db import write_path
from core.errors import DomainError
from leases.fence import fence_lease, require_active
from logs import rules, storage
from logs.locks import lock_artifact
from logs.models import Artifact, ArtifactPart, ArtifactState
from runs.states import AttemptState


@dataclass(frozen=True)
class Part:
    """One part of an artifact upload: ``name`` the file's path relative to the work directory
    ("/"-separated, matching a declared glob), its total ``size`` (bytes) and ``sha256`` (hex),
    and the part's ``offset`` and ``data`` (≤ ``ARTIFACT_PART_BYTES``). Parts arrive in order."""

    name: str
    size: int
    sha256: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class UploadResult:
    """``status`` receiving | stored | idempotent; the bytes received so far; the artifact id."""

    status: str
    received_bytes: int
    artifact_id: int


def _over(limit_field: str, limit: int, message: str) -> DomainError:
    return DomainError("artifact_limit_exceeded", message, field=limit_field, details={"limit": limit})


@write_path
def artifact_upload(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    part: Part,
) -> UploadResult:
    """Store one part of a declared artifact under both fences (docs/logs.md, Artifacts).

    Arguments: the session fence, the lease fence and a :class:`Part`. Locks worker, then run,
    then the artifact row. The lease must be held and the attempt running (artifacts are sent
    after the job ends and before the completion). The name must match one of the revision's
    ``output_paths``; the size, the attempt's file count and total bytes must stay within the
    revision's limits. When the last part arrives, the whole file's SHA-256 is checked and the
    file is stored (``output`` storage); a mismatch stores nothing of that part. An exact replay
    of a stored part (or of a stored artifact) answers ``idempotent``.

    Raises: fence codes, ``lease_completed``, ``lease_released``, ``lease_expired``,
    ``attempt_not_started``, ``artifact_not_declared``, ``artifact_limit_exceeded`` (field
    maxFiles | maxFileBytes | maxTotalBytes), ``artifact_conflict``, ``artifact_checksum_mismatch``,
    ``validation_failed`` (offset), ``lock_timeout``.
    """
    ctx = fence_lease(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
    )
    require_active(ctx.lease, ctx.now)
    if ctx.attempt.state != AttemptState.RUNNING:
        raise DomainError("attempt_not_started", "send the running ACK before artifacts", field="attemptId")
    revision = ctx.run.revision
    if not rules.matches_declared(part.name, list(revision.output_paths)):
        raise DomainError("artifact_not_declared", f"{part.name!r} matches no declared output", field="name")
    if part.size > revision.artifact_max_file_bytes:
        raise _over(
            "maxFileBytes",
            revision.artifact_max_file_bytes,
            f"the file is {part.size} bytes; the revision allows at most {revision.artifact_max_file_bytes}",
        )
    existing = (
        Artifact.objects.filter(attempt_id=ctx.attempt.pk, name=part.name)
        .values_list("pk", flat=True)
        .first()
    )
    if existing is None:
        others = Artifact.objects.filter(attempt_id=ctx.attempt.pk)
        if others.count() >= revision.artifact_max_files:
            raise _over(
                "maxFiles",
                revision.artifact_max_files,
                f"the revision allows at most {revision.artifact_max_files} artifacts per attempt",
            )
        total = sum(others.values_list("size", flat=True)) + part.size
        if total > revision.artifact_max_total_bytes:
            raise _over(
                "maxTotalBytes",
                revision.artifact_max_total_bytes,
                f"the attempt's artifacts would be {total} bytes; the revision allows at most "
                f"{revision.artifact_max_total_bytes}",
            )
        artifact = Artifact.objects.create(
            attempt_id=ctx.attempt.pk,
            run_id=ctx.run.pk,
            name=part.name,
            size=part.size,
            sha256=part.sha256,
            created_at=ctx.now,
            expires_at=ctx.now + timedelta(days=revision.output_retention_days),
        )
    else:
        locked = lock_artifact(existing)
        assert locked is not None  # the run lock is held: nothing deletes it meanwhile
        artifact = locked
        if artifact.size != part.size or artifact.sha256 != part.sha256:
            raise DomainError(
                "artifact_conflict",
                f"{part.name!r} is being uploaded with another size or SHA-256",
                field="sha256",
            )
    if artifact.state == ArtifactState.STORED:
        return UploadResult("idempotent", artifact.received_bytes, artifact.pk)
    if part.offset + len(part.data) > part.size:
        raise DomainError("validation_failed", "the part ends past the file's size", field="content")
    stored = (
        ArtifactPart.objects.filter(artifact=artifact, offset=part.offset)
        .values_list("data", flat=True)
        .first()
    )
    if stored is not None:
        if bytes(stored) == part.data:
            return UploadResult("idempotent", artifact.received_bytes, artifact.pk)
        raise DomainError("artifact_conflict", f"the part at offset {part.offset} differs", field="content")
    if part.offset != artifact.received_bytes:
        raise DomainError(
            "validation_failed",
            f"parts arrive in order: the next part starts at offset {artifact.received_bytes}",
            field="offset",
            details={"expectedOffset": artifact.received_bytes},
        )
    if not part.data and part.size:
        raise DomainError("validation_failed", "a part carries at least one byte", field="content")
    received = artifact.received_bytes + len(part.data)
    if received < part.size:
        ArtifactPart.objects.create(artifact=artifact, offset=part.offset, data=part.data)
        artifact.received_bytes = received
        artifact.save(update_fields=["received_bytes"])
        return UploadResult("receiving", received, artifact.pk)
    earlier = ArtifactPart.objects.filter(artifact=artifact).order_by("offset").values_list("data", flat=True)
    content = b"".join(bytes(data) for data in earlier) + part.data
    if hashlib.sha256(content).hexdigest() != part.sha256:
        raise DomainError(
            "artifact_checksum_mismatch",
            f"the {len(content)} bytes received do not have SHA-256 {part.sha256}",
            field="sha256",
        )
    artifact.storage_name = storage.put(rules.artifact_object_name(ctx.attempt.pk, artifact.pk), content)
    artifact.received_bytes = received
    artifact.state = ArtifactState.STORED
    artifact.stored_at = ctx.now
    artifact.save(update_fields=["storage_name", "received_bytes", "state", "stored_at"])
    ArtifactPart.objects.filter(artifact=artifact).delete()
    return UploadResult("stored", received, artifact.pk)
