"""Reading an attempt's log, live or compacted, and its artifacts (docs/logs.md, Reading)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO

from django.db.models import F

from core.errors import DomainError
from runs.models import RunAttempt
from runs.states import ATTEMPT_TERMINAL

from . import storage
from .models import Artifact, ArtifactState, AttemptLog, LogChunk

log = logging.getLogger(__name__)

#: Most bytes one read answers; a follower asks again from the next offset.
READ_LIMIT_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LogSlice:
    """Bytes of the log from ``after`` (combined positions), the offset to ask from next, whether
    the log is complete (the attempt ended: nothing more will arrive) and was truncated, and the
    stored size when read."""

    data: bytes
    next_offset: int
    complete: bool
    truncated: bool
    size: int


def _pieces(log: AttemptLog, after: int) -> Iterator[tuple[int, str, bytes | None]]:
    """(position, stream, bytes or None for "read from the object") of each segment ending after
    ``after``, in order."""
    if log.compacted_at is not None:
        for position, size, stream in log.index:
            if position + size > after:
                yield position, stream, None
        return
    rows = (
        LogChunk.objects.annotate(end=F("position") + F("size"))
        .filter(attempt_id=log.pk, end__gt=after)
        .order_by("position", "seq", "part")
        .values_list("position", "stream", "data")
    )
    for position, stream, data in rows.iterator(chunk_size=32):
        yield position, stream, bytes(data)


def read_log(
    attempt: RunAttempt, *, after: int = 0, stream: str | None = None, limit: int = READ_LIMIT_BYTES
) -> LogSlice:
    """The stored log of ``attempt`` from combined position ``after`` (bytes ≥ 0), only the
    ``stream`` (stdout | stderr) segments when given, at most ``limit`` bytes. ``next_offset`` is
    where the next read continues: the end of what was returned, or of what was examined when
    filtering by stream. Markers belong to the stream they interrupt. Raises ``log_expired``
    once the retention sweep deleted the log, ``log_gone``."""
    complete = attempt.state in ATTEMPT_TERMINAL
    log = AttemptLog.objects.filter(pk=attempt.pk).first()
    if log is None:
        return LogSlice(b"", after, complete, False, 0)
    if log.compacted_at is not None and not log.object_name:
        raise DomainError(
            "log_expired",
            f"the log of attempt #{attempt.number} expired on {_day(log.expires_at)}",
            details={"expiredAt": log.expires_at.isoformat() if log.expires_at else None},
        )
    sizes = {position: size for position, size, _ in log.index}
    out: list[bytes] = []
    taken = 0
    next_offset = after
    for position, name, data in _pieces(log, after):
        if taken >= limit:
            break
        size = len(data) if data is not None else sizes[position]
        start = max(after, position) - position
        if stream is not None and name != stream:
            next_offset = position + size
            continue
        length = min(size - start, limit - taken)
        if data is None:
            piece = _read_object(log, position + start, length)
        else:
            piece = data[start : start + length]
        out.append(piece)
        taken += len(piece)
        next_offset = position + start + len(piece)
    else:
        if stream is not None:  # everything stored when the read began was examined
            next_offset = max(next_offset, log.stored_bytes)
    return LogSlice(b"".join(out), next_offset, complete, log.truncated, log.stored_bytes)


def _day(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d}" if moment is not None else "an unknown date"


def _read_object(log_row: AttemptLog, start: int, length: int) -> bytes:
    """Bytes of a compacted log object. Raises ``log_gone`` (one warning line) when the object
    is missing from the output storage."""
    try:
        return storage.read(log_row.object_name, start, length)
    except OSError as exc:
        log.warning("compacted log %s of attempt %s is missing: %s", log_row.object_name, log_row.pk, exc)
        raise DomainError(
            "log_gone", "the stored log of this attempt is missing from the output storage"
        ) from exc


def open_artifact(artifact: Artifact) -> IO[bytes]:
    """The stored object of an artifact, opened for reading. Raises ``artifact_gone`` (one
    warning line) when the object is missing from the output storage."""
    try:
        return storage.output_storage().open(artifact.storage_name, "rb")
    except OSError as exc:
        log.warning(
            "artifact %s (%s) of attempt %s is missing: %s",
            artifact.pk,
            artifact.storage_name,
            artifact.attempt_id,
            exc,
        )
        raise DomainError(
            "artifact_gone", "the stored file of this artifact is missing from the output storage"
        ) from exc


def attempt_artifacts(attempt_ids: list[uuid.UUID]) -> list[Artifact]:
    """The stored artifacts of these attempts, by attempt then name."""
    return list(
        Artifact.objects.filter(attempt_id__in=attempt_ids, state=ArtifactState.STORED)
        .exclude(storage_name="")
        .order_by("attempt", "name")
    )


def run_attempt(run_id: uuid.UUID, number: int | None) -> RunAttempt:
    """Attempt ``number`` of the run (the latest when None). Raises ``log_not_found``."""
    attempts = RunAttempt.objects.filter(run_id=run_id)
    attempt = (attempts.filter(number=number) if number is not None else attempts.order_by("-number")).first()
    if attempt is None:
        raise DomainError("log_not_found", "no such attempt of this run", field="attempt" if number else None)
    return attempt


def run_artifacts(run_id: uuid.UUID) -> list[Artifact]:
    """The stored artifacts of every attempt of a run, by attempt number then name."""
    return list(
        Artifact.objects.filter(run_id=run_id, state=ArtifactState.STORED)
        .exclude(storage_name="")
        .select_related("attempt")
        .order_by("attempt__number", "name")
    )


def run_artifact(run_id: uuid.UUID, artifact_id: int) -> Artifact:
    """One stored artifact of a run. Raises ``artifact_not_found``, ``artifact_expired`` (the
    retention sweep deleted its file)."""
    artifact = Artifact.objects.filter(run_id=run_id, pk=artifact_id, state=ArtifactState.STORED).first()
    if artifact is None:
        raise DomainError("artifact_not_found", "no such artifact of this run")
    if not artifact.storage_name:
        raise DomainError(
            "artifact_expired",
            f"{artifact.name!r} expired on {_day(artifact.expires_at)}",
            details={"expiredAt": artifact.expires_at.isoformat() if artifact.expires_at else None},
        )
    return artifact
