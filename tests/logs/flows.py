"""Log and artifact calls for tests, on top of tests.leases.flows."""

from __future__ import annotations

import hashlib

from actions.artifacts import Part, UploadResult, artifact_upload
from actions.logs import AppendResult, Chunk, Segment, log_append
from logs.models import Artifact, ArtifactPart, AttemptLog, LogChunk
from tests.leases.flows import Held


def append(
    held: Held, seq: int, data: bytes, stream: str = "stdout", offset: int | None = None, **fence
) -> AppendResult:
    """Send a chunk of one segment; ``offset`` defaults to the bytes of ``stream`` already sent."""
    return append_segments(held, seq, [(stream, offset, data)], **fence)


def append_segments(
    held: Held, seq: int, segments: list[tuple[str, int | None, bytes]], **fence
) -> AppendResult:
    """Send one chunk of several segments ``(stream, offset or None, bytes)``."""
    sent = held.__dict__.setdefault("_sent", {})
    parts = []
    for stream, offset, data in segments:
        at = sent.get(stream, 0) if offset is None else offset
        parts.append(Segment(stream=stream, offset=at, data=data))
        sent[stream] = max(sent.get(stream, 0), at + len(data))
    return log_append(**held.fence(**fence), chunk=Chunk(seq=seq, segments=tuple(parts)))


def upload(
    held: Held, name: str, content: bytes, part_bytes: int = 32768, sha256: str | None = None, **fence
) -> UploadResult:
    """Upload a whole artifact in parts; returns the last answer."""
    digest = sha256 or hashlib.sha256(content).hexdigest()
    offsets = list(range(0, len(content), part_bytes)) or [0]
    result = None
    for offset in offsets:
        result = artifact_upload(
            **held.fence(**fence),
            part=Part(
                name=name,
                size=len(content),
                sha256=digest,
                offset=offset,
                data=content[offset : offset + part_bytes],
            ),
        )
    assert result is not None
    return result


def output_rows() -> tuple:
    """Every output row: what a refused call must leave alone."""
    return (
        list(AttemptLog.objects.order_by("pk").values()),
        list(LogChunk.objects.order_by("pk").values()),
        list(Artifact.objects.order_by("pk").values()),
        list(ArtifactPart.objects.order_by("pk").values()),
    )
