"""What one log chunk does to an attempt's log (docs/logs.md, Log chunks): the rules of an append
as a pure plan over the log's state, shared by both stores' write paths (``actions.logs``).

:func:`plan_append` takes the log's state (:class:`LogState`, the ``AttemptLog`` columns an
append reads), the chunk and what the store looked up for it, and returns a :class:`Plan` — the
segment rows to insert, the log's next state, the answer — or raises the refusal. It touches no
database: the caller holds the locks, writes the plan, and so both stores apply the same rules
in the same order (replay, truncation, sequence, offsets, rate, markers, masking, cap).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from core.errors import DomainError
from protocol import masking

from . import rules

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
        """The chunk's digest as sent (seq, and each segment's stream, offset, length and bytes):
        an exact replay has the same one."""
        digest = hashlib.sha256(f"{self.seq}\n".encode())
        for segment in self.segments:
            digest.update(f"{segment.stream}\n{segment.offset}\n{len(segment.data)}\n".encode())
            digest.update(segment.data)
        return digest.hexdigest()


@dataclass(frozen=True)
class LogState:
    """An attempt log's state as an append sees it (``logs.models.AttemptLog``'s columns):
    ``stream_ends`` {stream: the agent's offset after the last byte received}, ``stream_newline``
    {stream: whether its stored bytes end with a newline}, ``stream_tails`` {stream: its last
    stored bytes after their last NUL, latin-1, for masking across chunks}, the rate window (database clock).
    The defaults are a log that has no row yet."""

    next_seq: int = 1
    stored_bytes: int = 0
    stream_ends: Mapping[str, int] = field(default_factory=dict)
    stream_newline: Mapping[str, bool] = field(default_factory=dict)
    stream_tails: Mapping[str, str] = field(default_factory=dict)
    truncated: bool = False
    window_started_at: datetime | None = None
    window_bytes: int = 0

    def continuity(self) -> dict[str, object]:
        """The columns a chunk's rows are computed from (JSON-ready; every append that changes
        one of them also moves ``next_seq``): what the PostgreSQL function compares before it
        writes rows planned from a remembered state."""
        return {
            "nextSeq": self.next_seq,
            "storedBytes": self.stored_bytes,
            "ends": dict(self.stream_ends),
            "newline": dict(self.stream_newline),
            "tails": dict(self.stream_tails),
            "truncated": self.truncated,
        }


@dataclass
class Part:
    """One segment row to insert: its index in the chunk, stream, the agent's offset, its
    position in the combined log and the stored bytes (markers included, secrets masked)."""

    part: int
    stream: str
    offset: int
    position: int
    data: bytes


@dataclass(frozen=True)
class Plan:
    """What an accepted chunk does: ``status`` stored | truncated | idempotent; ``state`` the log
    afterwards (the same state when nothing is written); ``parts`` the rows to insert (part 0
    carries the chunk's digest); ``overwrite`` {stream: trailing bytes of its already stored rows
    to overwrite with ``*``} (a secret that straddled the chunk boundary); ``writes`` whether
    anything is written; ``counted`` whether the chunk's bytes count into the rate window;
    ``tails`` whether ``state.stream_tails`` changed (the revision has secrets)."""

    status: str
    state: LogState
    parts: tuple[Part, ...] = ()
    overwrite: Mapping[str, int] = field(default_factory=dict)
    writes: bool = False
    counted: bool = False
    tails: bool = False


def plan_append(
    state: LogState,
    chunk: Chunk,
    *,
    digest: str,
    previous: str | None,
    secrets: list[bytes],
    now: datetime | None,
    max_bytes: int,
    rate_bytes_per_second: int,
) -> Plan:
    """The plan of ``chunk`` on a log in ``state`` (docs/logs.md, Log chunks).

    Arguments: ``digest`` the chunk's SHA-256 as sent (``Chunk.sha256``); ``previous`` the digest
    stored for ``chunk.seq`` (part 0) when ``chunk.seq < state.next_seq`` and one was stored, else
    None; ``secrets`` the revision's secret values (``rules.secret_values``); ``now`` the database
    clock — None leaves the rate window to the caller (the PostgreSQL function applies the same
    rule on its clock); ``max_bytes`` the per-attempt cap; ``rate_bytes_per_second`` the rate.

    Raises ``log_chunk_conflict`` (same ``seq`` with other content, a ``seq`` behind the log that
    was never stored, an offset behind the stored bytes of its stream) and ``log_backpressure``.
    """
    if previous is not None:
        if previous == digest:
            return Plan("idempotent", state)
        raise DomainError(
            "log_chunk_conflict", f"chunk {chunk.seq} was stored with other content", field="seq"
        )
    if state.truncated:
        if chunk.seq >= state.next_seq:
            return Plan("truncated", dataclasses.replace(state, next_seq=chunk.seq + 1), writes=True)
        return Plan("truncated", state)
    if chunk.seq < state.next_seq:
        raise DomainError(
            "log_chunk_conflict",
            f"chunk {chunk.seq} is behind the log (next is {state.next_seq}) and was never stored",
            field="seq",
            details={"nextSeq": state.next_seq},
        )
    ends = {stream: int(end) for stream, end in state.stream_ends.items()}
    for index, segment in enumerate(chunk.segments):
        end = ends.get(segment.stream, 0)
        if segment.offset < end:
            raise DomainError(
                "log_chunk_conflict",
                f"offset {segment.offset} is behind the {segment.stream} bytes already stored (up to {end})",
                field=f"segments[{index}].offset",
                details={"nextSeq": state.next_seq},
            )
        ends[segment.stream] = segment.offset + len(segment.data)
    window_started_at, window_bytes = state.window_started_at, state.window_bytes
    if now is not None:
        rate = rate_bytes_per_second * RATE_WINDOW_SECONDS
        elapsed = (now - window_started_at).total_seconds() if window_started_at else None
        if elapsed is None or elapsed >= RATE_WINDOW_SECONDS:
            window_started_at, window_bytes = now, 0
        if window_bytes and window_bytes + chunk.size > rate:
            raise DomainError(
                "log_backpressure",
                f"this attempt logs faster than {rate_bytes_per_second} bytes per second",
                retry_after=1,
            )
        window_bytes += chunk.size
    stream_ends = dict(state.stream_ends)
    newline = dict(state.stream_newline)
    tails = {stream: tail.encode("latin-1") for stream, tail in state.stream_tails.items()}
    truncated = False
    sequence_gap = chunk.seq > state.next_seq
    parts: list[Part] = []
    overwrite: dict[str, int] = {}
    position = state.stored_bytes
    for index, segment in enumerate(chunk.segments):
        at_line_start = bool(newline.get(segment.stream, True))
        pieces: list[bytes] = []
        if sequence_gap:
            pieces.append(
                rules.sequence_gap_marker(state.next_seq, chunk.seq - 1, at_line_start=at_line_start)
            )
            at_line_start, sequence_gap = True, False
        end = int(stream_ends.get(segment.stream, 0))
        if segment.offset > end:
            pieces.append(rules.gap_marker(segment.stream, segment.offset - end, at_line_start=at_line_start))
        stream_ends[segment.stream] = segment.offset + len(segment.data)
        pieces.append(_mask_segment(segment, bool(pieces), secrets, tails, parts, overwrite))
        data = b"".join(pieces)
        room = max_bytes - position
        if len(data) > room and not truncated:
            data = data[: rules.utf8_cut(data, max(0, room))]  # no character cut in half
            at_end = data.endswith(b"\n") if data else bool(newline.get(segment.stream, True))
            data += rules.truncation_marker(max_bytes, at_line_start=at_end)
            truncated = True
        elif truncated:
            data = b""
        if data:
            newline[segment.stream] = data.endswith(b"\n")
        # Empty segments are kept too: part 0 carries the chunk's digest for replays.
        parts.append(Part(index, segment.stream, segment.offset, position, data))
        position += len(data)
    after = LogState(
        next_seq=chunk.seq + 1,
        stored_bytes=position,
        stream_ends=stream_ends,
        stream_newline=newline,
        stream_tails=(
            {stream: tail.decode("latin-1") for stream, tail in tails.items()}
            if secrets
            else state.stream_tails
        ),
        truncated=truncated,
        window_started_at=window_started_at,
        window_bytes=window_bytes,
    )
    return Plan(
        "truncated" if truncated else "stored",
        after,
        tuple(parts),
        overwrite,
        writes=True,
        counted=True,
        tails=bool(secrets),
    )


def _mask_segment(
    segment: Segment,
    after_marker: bool,
    secrets: list[bytes],
    tails: dict[str, bytes],
    parts: list[Part],
    overwrite: dict[str, int],
) -> bytes:
    """The segment's bytes with secrets masked, also one that began in the stream's last stored
    bytes (``tails``): its part here becomes ``[MASKED]`` and its part already stored is
    overwritten with ``*`` (same length, so positions hold) in this chunk's ``parts`` or, for the
    rest, in the stored rows (``overwrite``: the longest such end per stream). Updates ``tails``.
    A marker before the segment breaks the stream's continuity."""
    if not secrets:
        return rules.mask(segment.data, secrets)
    tail = b"" if after_marker else tails.get(segment.stream, b"")
    covered, cut = masking.straddling(tail, segment.data, secrets)
    masked = rules.mask(segment.data[cut:], secrets)
    if covered:
        masked = rules.MASK + masked
        rest = covered
        for part in [part for part in reversed(parts) if part.stream == segment.stream and part.data]:
            part.data, rest = star_end(part.data, rest)
            if not rest:
                break
        if rest:
            overwrite[segment.stream] = max(rest, overwrite.get(segment.stream, 0))
        tail = tail[: len(tail) - covered] + b"*" * covered
    keep = max(len(value) for value in secrets) - 1
    kept = (tail + masked)[-keep:] if keep else b""
    # No secret holds a NUL (task creation refuses one in an env value), so none can begin before
    # the last NUL; and the tails are a JSON column, which PostgreSQL's jsonb refuses U+0000 in.
    tails[segment.stream] = kept[kept.rfind(b"\0") + 1 :]
    return masked


def star_end(data: bytes, count: int) -> tuple[bytes, int]:
    """``data`` with up to ``count`` bytes at its end overwritten with ``*``, and the count left."""
    take = min(count, len(data))
    return data[: len(data) - take] + b"*" * take, count - take
