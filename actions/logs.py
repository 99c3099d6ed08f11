"""Live job logs: each chunk fenced by the run lease, in one transaction; compaction and
retention sweeps (docs/logs.md; ADR-0012 §3 for the fences)."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction

from core.conf import output
from core.db import db_now, write_path
from core.errors import DomainError
from leases.fence import fence_lease, require_active
from logs import rules, storage
from logs.locks import lock_attempt_log, lock_expired_artifacts
from logs.models import Artifact, ArtifactState, AttemptLog, LogChunk
from protocol import masking
from runs.models import RunAttempt
from runs.states import ATTEMPT_TERMINAL, AttemptState

#: The backpressure window, seconds (docs/logs.md, Rate).
RATE_WINDOW_SECONDS = 1.0


@dataclass(frozen=True)
class Segment:
    """One stream's bytes in a chunk: ``stream`` stdout | stderr, ``offset`` the agent's
    monotonic offset of its first byte in that stream, ``data`` raw bytes (may be empty: a
    segment that only moves the offset reports a trailing gap)."""

    stream: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class Chunk:
    """One chunk as the worker sent it: ``seq`` ≥ 1 (per attempt, from 1, no reuse) and its
    segments in the order the agent read them (both streams interleaved; ≤ ``LOG_CHUNK_BYTES``
    in all)."""

    seq: int
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(len(segment.data) for segment in self.segments)

    def sha256(self) -> str:
        digest = hashlib.sha256(f"{self.seq}\n".encode())
        for segment in self.segments:
            digest.update(f"{segment.stream}\n{segment.offset}\n{len(segment.data)}\n".encode())
            digest.update(segment.data)
        return digest.hexdigest()


@dataclass(frozen=True)
class AppendResult:
    """The answer to a chunk: ``status`` stored | idempotent | truncated (nothing more is kept),
    the sequence number the log expects next, how long the worker waits before its next send
    (seconds), and the stored size of the log."""

    status: str
    next_seq: int
    interval_seconds: float
    truncated: bool
    stored_bytes: int


def _interval(log: AttemptLog) -> float:
    """The send interval the answer asks for: the configured one, doubled while the attempt
    used more than half its byte rate in the current window (docs/logs.md, Rate)."""
    settings = output()
    busy = log.window_bytes * 2 > settings.log_rate_bytes_per_second * RATE_WINDOW_SECONDS
    return settings.log_interval_seconds * (2 if busy else 1)


def _result(status: str, log: AttemptLog) -> AppendResult:
    return AppendResult(status, log.next_seq, _interval(log), log.truncated, log.stored_bytes)


#: The AttemptLog columns an append changes.
_APPEND_FIELDS = (
    "stored_bytes",
    "stream_ends",
    "stream_newline",
    "truncated",
    "next_seq",
    "window_started_at",
    "window_bytes",
)


def _commit_without_flush_wait() -> None:
    """PostgreSQL: this transaction's commit does not wait for its WAL to reach the disk
    (``SET LOCAL synchronous_commit TO off``; docs/logs.md, Rate). A crash of the database within
    a few hundred ms of an acknowledged chunk can lose it; the next chunk then shows the chunk
    gap marker. Consistency is unaffected; SQLite keeps its own settings."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


@write_path
def log_append(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    chunk: Chunk,
) -> AppendResult:
    """Store one chunk of a running attempt's output under both fences (docs/logs.md, Log chunks).

    Arguments: the session fence, the lease fence and a :class:`Chunk`. Reads the worker row
    without locking it (a chunk changes no worker state and must not queue behind the worker's
    claims), locks the run (``leases.fence``), then the attempt's log row. The lease must be
    held (leased, unexpired by the DB clock) and the attempt running; otherwise nothing is
    stored. An exact replay of a
    stored ``seq`` answers ``idempotent`` and changes nothing; the same ``seq`` with other content
    is ``log_chunk_conflict``. A sequence or offset jump stores a gap marker line before the
    data; secret ``env`` values of the revision are masked; past ``LOG_MAX_BYTES`` the log keeps
    one truncation marker and nothing more (``truncated``). Over the byte rate the chunk is
    refused with ``log_backpressure`` (429, Retry-After).

    Raises: fence codes, ``lease_completed``, ``lease_released``, ``lease_expired``,
    ``attempt_not_started``, ``log_chunk_conflict``, ``log_backpressure``, ``lock_timeout``.
    """
    _commit_without_flush_wait()
    ctx = fence_lease(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
        lock_worker=False,
    )
    require_active(ctx.lease, ctx.now)
    if ctx.attempt.state != AttemptState.RUNNING:
        raise DomainError("attempt_not_started", "send the running ACK before the log", field="attemptId")
    log = lock_attempt_log(ctx.attempt.pk)
    if log is None:
        log = AttemptLog.objects.create(attempt=ctx.attempt, run=ctx.run, created_at=ctx.now)
    digest = chunk.sha256()
    previous = None
    if chunk.seq < log.next_seq:  # only a seq below the next expected one can have been stored
        stored = LogChunk.objects.filter(attempt_id=ctx.attempt.pk, seq=chunk.seq, part=0)
        previous = stored.values_list("sent_sha256", flat=True).first()
    if previous is not None:
        if previous == digest:
            return _result("idempotent", log)
        raise DomainError(
            "log_chunk_conflict", f"chunk {chunk.seq} was stored with other content", field="seq"
        )
    if log.truncated:
        if chunk.seq >= log.next_seq:
            log.next_seq = chunk.seq + 1
            log.save(update_fields=["next_seq"])
        return _result("truncated", log)
    if chunk.seq < log.next_seq:
        raise DomainError(
            "log_chunk_conflict",
            f"chunk {chunk.seq} is behind the log (next is {log.next_seq}) and was never stored",
            field="seq",
            details={"nextSeq": log.next_seq},
        )
    ends = {stream: int(end) for stream, end in log.stream_ends.items()}
    for index, segment in enumerate(chunk.segments):
        end = ends.get(segment.stream, 0)
        if segment.offset < end:
            raise DomainError(
                "log_chunk_conflict",
                f"offset {segment.offset} is behind the {segment.stream} bytes already stored (up to {end})",
                field=f"segments[{index}].offset",
                details={"nextSeq": log.next_seq},
            )
        ends[segment.stream] = segment.offset + len(segment.data)
    settings = output()
    rate = settings.log_rate_bytes_per_second * RATE_WINDOW_SECONDS
    elapsed = (ctx.now - log.window_started_at).total_seconds() if log.window_started_at else None
    if elapsed is None or elapsed >= RATE_WINDOW_SECONDS:
        log.window_started_at, log.window_bytes = ctx.now, 0
    if log.window_bytes and log.window_bytes + chunk.size > rate:
        raise DomainError(
            "log_backpressure",
            f"this attempt logs faster than {settings.log_rate_bytes_per_second} bytes per second",
            retry_after=1,
        )
    revision = ctx.run.revision
    secrets = rules.secret_values(revision.env, revision.secret_env)
    newline = dict(log.stream_newline)
    tails = {stream: tail.encode("latin-1") for stream, tail in log.stream_tails.items()}
    sequence_gap = chunk.seq > log.next_seq
    rows: list[LogChunk] = []
    position = log.stored_bytes
    for index, segment in enumerate(chunk.segments):
        at_line_start = bool(newline.get(segment.stream, True))
        parts: list[bytes] = []
        if sequence_gap:
            parts.append(rules.sequence_gap_marker(log.next_seq, chunk.seq - 1, at_line_start=at_line_start))
            at_line_start, sequence_gap = True, False
        end = int(log.stream_ends.get(segment.stream, 0))
        if segment.offset > end:
            parts.append(rules.gap_marker(segment.stream, segment.offset - end, at_line_start=at_line_start))
        log.stream_ends = {**log.stream_ends, segment.stream: segment.offset + len(segment.data)}
        masked = _mask_segment(ctx.attempt.pk, segment, bool(parts), secrets, tails, rows)
        parts.append(masked)
        data = b"".join(parts)
        room = settings.log_max_bytes - position
        if len(data) > room and not log.truncated:
            data = data[: rules.utf8_cut(data, max(0, room))]  # no character cut in half
            at_end = data.endswith(b"\n") if data else bool(newline.get(segment.stream, True))
            data += rules.truncation_marker(settings.log_max_bytes, at_line_start=at_end)
            log.truncated = True
        elif log.truncated:
            data = b""
        if data:
            newline[segment.stream] = data.endswith(b"\n")
        # Empty segments are kept too: part 0 carries the chunk's digest for replays.
        rows.append(
            LogChunk(
                attempt_id=ctx.attempt.pk,
                seq=chunk.seq,
                part=index,
                stream=segment.stream,
                offset=segment.offset,
                position=position,
                size=len(data),
                data=data,
                sent_sha256=digest if index == 0 else "",
                created_at=ctx.now,
            )
        )
        position += len(data)
    LogChunk.objects.bulk_create(rows)
    log.stored_bytes = position
    log.stream_newline = newline
    if secrets:
        log.stream_tails = {stream: tail.decode("latin-1") for stream, tail in tails.items()}
    log.next_seq = chunk.seq + 1
    log.window_bytes += chunk.size
    log.save(update_fields=[*_APPEND_FIELDS, *(["stream_tails"] if secrets else [])])
    return _result("truncated" if log.truncated else "stored", log)


def _mask_segment(
    attempt_id: uuid.UUID,
    segment: Segment,
    after_marker: bool,
    secrets: list[bytes],
    tails: dict[str, bytes],
    rows: list[LogChunk],
) -> bytes:
    """The segment's bytes with secrets masked, also one that began in the stream's last stored
    bytes (``tails``): its part here becomes ``[MASKED]`` and its part already stored is
    overwritten with ``*`` (same length, so positions hold) in this chunk's ``rows`` or the stored
    rows. Updates ``tails``. A marker before the segment breaks the stream's continuity."""
    if not secrets:
        return rules.mask(segment.data, secrets)
    tail = b"" if after_marker else tails.get(segment.stream, b"")
    covered, cut = masking.straddling(tail, segment.data, secrets)
    masked = rules.mask(segment.data[cut:], secrets)
    if covered:
        masked = rules.MASK + masked
        _overwrite_stored_end(attempt_id, segment.stream, covered, rows)
        tail = tail[: len(tail) - covered] + b"*" * covered
    keep = max(len(value) for value in secrets) - 1
    tails[segment.stream] = (tail + masked)[-keep:] if keep else b""
    return masked


def _overwrite_stored_end(attempt_id: uuid.UUID, stream: str, count: int, rows: list[LogChunk]) -> None:
    """Overwrite the last ``count`` stored bytes of ``stream`` with ``*``: first in this chunk's
    unsaved ``rows``, then in the attempt's stored rows (newest first)."""
    for row in [row for row in reversed(rows) if row.stream == stream and row.size]:
        count = _star_end(row, count)
        if not count:
            return
    for row in LogChunk.objects.filter(attempt_id=attempt_id, stream=stream, size__gt=0).order_by(
        "-position"
    ):
        count = _star_end(row, count)
        row.save(update_fields=["data"])
        if not count:
            return


def _star_end(row: LogChunk, count: int) -> int:
    data = bytes(row.data)
    take = min(count, len(data))
    row.data = data[: len(data) - take] + b"*" * take
    return count - take


def _merged_index(rows: list[tuple[int, int, str]]) -> list[list]:
    index: list[list] = []
    for position, size, stream in rows:
        if not size:
            continue
        if index and index[-1][2] == stream and index[-1][0] + index[-1][1] == position:
            index[-1][1] += size
        else:
            index.append([position, size, stream])
    return index


@write_path
def log_compact(*, attempt_id: uuid.UUID) -> bool:
    """Write an ended attempt's live chunks as one stored object (``logs/<attempt>.log`` in the
    ``output`` storage) with an index of stream segments, delete the rows and set the log's
    expiry (the revision's retention days from now). One transaction; the attempt's run is not
    locked: an ended attempt's lease is settled, so no chunk can arrive. Returns False when
    there was nothing to do (no log, already compacted, attempt still live)."""
    log = lock_attempt_log(attempt_id)
    if log is None or log.compacted_at is not None:
        return False
    attempt = RunAttempt.objects.select_related("run__revision").get(pk=attempt_id)
    if attempt.state not in ATTEMPT_TERMINAL:
        return False
    now = db_now()
    rows = list(
        LogChunk.objects.filter(attempt_id=attempt_id)
        .order_by("position", "seq", "part")
        .values_list("position", "size", "stream", "data")
    )
    name = storage.put(rules.object_name(attempt_id), b"".join(bytes(row[3]) for row in rows))
    log.object_name = name
    log.index = _merged_index([(p, n, s) for p, n, s, _ in rows])
    log.compacted_at = now
    log.expires_at = now + timedelta(days=attempt.run.revision.output_retention_days)
    log.save(update_fields=["object_name", "index", "compacted_at", "expires_at"])
    LogChunk.objects.filter(attempt_id=attempt_id).delete()
    return True


def sweep_log_compaction(batch: int = 64) -> int:
    """Compact up to ``batch`` logs of ended attempts, one transaction each. Returns how many."""
    pending = list(
        AttemptLog.objects.filter(compacted_at__isnull=True, attempt__state__in=ATTEMPT_TERMINAL).values_list(
            "pk", flat=True
        )[:batch]
    )
    return sum(1 for attempt_id in pending if log_compact(attempt_id=attempt_id))


@write_path
def output_expire(*, attempt_id: uuid.UUID) -> int:
    """Expire an attempt's log and artifacts past their retention: their stored objects go once
    the transaction commits (and the attempt's artifact directory when it is left empty); the
    log row and stored artifact rows stay, emptied, so reads answer ``log_expired`` /
    ``artifact_expired`` (docs/logs.md, Retention). Returns the number of rows expired."""
    now = db_now()
    deleted = 0
    log = lock_attempt_log(attempt_id)
    names: list[str] = []
    if log is not None and log.expires_at is not None and log.expires_at <= now and log.object_name:
        # The row stays (empty object name and index) so a read answers ``log_expired``.
        names.append(log.object_name)
        LogChunk.objects.filter(attempt_id=attempt_id).delete()
        log.object_name, log.index = "", []
        log.save(update_fields=["object_name", "index"])
        deleted += 1
    for artifact in lock_expired_artifacts(attempt_id, now):
        if artifact.storage_name:
            names.append(artifact.storage_name)
        if artifact.state == ArtifactState.STORED:
            # The row stays (empty storage name) so a download answers ``artifact_expired``.
            artifact.storage_name = ""
            artifact.save(update_fields=["storage_name"])
        else:
            artifact.delete()  # an upload that never finished
        deleted += 1

    def remove_objects() -> None:
        for name in names:
            storage.remove(name)
        storage.remove_empty_directory(rules.artifact_directory(attempt_id))

    transaction.on_commit(remove_objects)
    return deleted


def sweep_output_retention(batch: int = 64) -> int:
    """Delete logs and artifacts past their retention (the revision's ``output_retention_days``),
    up to ``batch`` attempts, one transaction each. Returns the rows deleted."""
    now = db_now()
    logs = AttemptLog.objects.filter(expires_at__lte=now).exclude(object_name="")
    artifacts = Artifact.objects.filter(expires_at__lte=now).exclude(
        state=ArtifactState.STORED, storage_name=""
    )
    attempts = set(logs.values_list("pk", flat=True)[:batch]) | set(
        artifacts.values_list("attempt_id", flat=True)[:batch]
    )
    return sum(output_expire(attempt_id=attempt_id) for attempt_id in list(attempts)[:batch])
