"""Live job logs: each chunk fenced by the run lease, in one transaction; compaction and
retention sweeps (docs/logs.md; ADR-0012 §3 for the fences).

An append's rules are ``logs.appending.plan_append`` (pure); this module fences, locks, and
writes the plan. SQLite runs the whole append through the ORM. PostgreSQL runs it as one call
of ``ql_log_append`` (migration logs 0003) in the common case — see :func:`_append_in_database`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from core.conf import output
from core.db import db_now, write_path
from core.errors import DomainError
from leases.fence import fence_lease, require_active
from leases.tokens import token_digest
from logs import rules, storage
from logs.appending import RATE_WINDOW_SECONDS, Chunk, LogState, Plan, Segment, plan_append, star_end
from logs.locks import lock_attempt_log, lock_expired_artifacts
from logs.models import Artifact, ArtifactState, AttemptLog, LogChunk
from runs.models import RunAttempt
from runs.states import ATTEMPT_TERMINAL, AttemptState

__all__ = ["RATE_WINDOW_SECONDS", "AppendResult", "Chunk", "Segment", "log_append"]


@dataclasses.dataclass(frozen=True)
class AppendResult:
    """The answer to a chunk: ``status`` stored | idempotent | truncated (nothing more is kept),
    the sequence number the log expects next, how long the worker waits before its next send
    (seconds), and the stored size of the log."""

    status: str
    next_seq: int
    interval_seconds: float
    truncated: bool
    stored_bytes: int


def _interval(window_bytes: int) -> float:
    """The send interval the answer asks for: the configured one, doubled while the attempt
    used more than half its byte rate in the current window (docs/logs.md, Rate)."""
    settings = output()
    busy = window_bytes * 2 > settings.log_rate_bytes_per_second * RATE_WINDOW_SECONDS
    return settings.log_interval_seconds * (2 if busy else 1)


def _result(status: str, state: LogState) -> AppendResult:
    return AppendResult(
        status, state.next_seq, _interval(state.window_bytes), state.truncated, state.stored_bytes
    )


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
    stored. An exact replay of a stored ``seq`` answers ``idempotent`` and changes nothing; the
    same ``seq`` with other content is ``log_chunk_conflict``. A sequence or offset jump stores
    a gap marker line before the data; secret ``env`` values of the revision are masked; past
    ``LOG_MAX_BYTES`` the log keeps one truncation marker and nothing more (``truncated``). Over
    the byte rate the chunk is refused with ``log_backpressure`` (429, Retry-After). The rules
    are ``logs.appending.plan_append``.

    PostgreSQL: usually one statement (``ql_log_append``, migration logs 0003; two when this
    process has not seen the attempt's log yet or another process wrote it since); every case
    the function leaves to Python (any fence refusal, a lapse an outage excuses) is answered by
    the ORM path below in the same transaction, with its codes.

    Raises: fence codes, ``lease_completed``, ``lease_released``, ``lease_expired``,
    ``attempt_not_started``, ``log_chunk_conflict``, ``log_backpressure``, ``lock_timeout``.
    """
    fence = (worker_id, session_id, generation, attempt_id, lease_generation, lease_token)
    if connection.vendor == "postgresql":
        done = _append_in_database(*fence, chunk=chunk)
        if done is not None:
            return done
    return _append_orm(*fence, chunk=chunk)


def _append_orm(
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    *,
    chunk: Chunk,
) -> AppendResult:
    """The append through the ORM (SQLite, and every case ``ql_log_append`` hands back)."""
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
    state = LogState(
        next_seq=log.next_seq,
        stored_bytes=log.stored_bytes,
        stream_ends=log.stream_ends,
        stream_newline=log.stream_newline,
        stream_tails=log.stream_tails,
        truncated=log.truncated,
        window_started_at=log.window_started_at,
        window_bytes=log.window_bytes,
    )
    digest = chunk.sha256()
    previous = None
    if chunk.seq < log.next_seq:  # only a seq below the next expected one can have been stored
        stored = LogChunk.objects.filter(attempt_id=ctx.attempt.pk, seq=chunk.seq, part=0)
        previous = stored.values_list("sent_sha256", flat=True).first()
    revision = ctx.run.revision  # loaded by the fence
    settings = output()
    plan = plan_append(
        state,
        chunk,
        digest=digest,
        previous=previous,
        secrets=rules.secret_values(revision.env, revision.secret_env),
        now=ctx.now,
        max_bytes=settings.log_max_bytes,
        rate_bytes_per_second=settings.log_rate_bytes_per_second,
    )
    if not plan.writes:
        return _result(plan.status, state)
    for stream, count in plan.overwrite.items():
        _overwrite_stored_end(ctx.attempt.pk, stream, count)
    after = plan.state
    if not plan.counted:  # a truncated log only moves on its next seq
        log.next_seq = after.next_seq
        log.save(update_fields=["next_seq"])
        return _result(plan.status, after)
    LogChunk.objects.bulk_create(
        [
            LogChunk(
                attempt_id=ctx.attempt.pk,
                seq=chunk.seq,
                part=part.part,
                stream=part.stream,
                offset=part.offset,
                position=part.position,
                size=len(part.data),
                data=part.data,
                sent_sha256=digest if part.part == 0 else "",
                created_at=ctx.now,
            )
            for part in plan.parts
        ]
    )
    log.stored_bytes, log.truncated, log.next_seq = after.stored_bytes, after.truncated, after.next_seq
    log.stream_ends, log.stream_newline = dict(after.stream_ends), dict(after.stream_newline)
    log.window_started_at, log.window_bytes = after.window_started_at, after.window_bytes
    log.stream_tails = dict(after.stream_tails)
    log.save(update_fields=[*_APPEND_FIELDS, *(["stream_tails"] if plan.tails else [])])
    return _result(plan.status, after)


def _overwrite_stored_end(attempt_id: uuid.UUID, stream: str, count: int) -> None:
    """Overwrite the last ``count`` stored bytes of ``stream`` with ``*`` in the attempt's stored
    rows (newest first): the part of a secret that straddled a chunk boundary."""
    for row in LogChunk.objects.filter(attempt_id=attempt_id, stream=stream, size__gt=0).order_by(
        "-position"
    ):
        row.data, count = star_end(bytes(row.data), count)
        row.save(update_fields=["data"])
        if not count:
            return


# --- PostgreSQL: the append in one round trip -----------------------------------------------------
#
# ``ql_log_append`` (migration logs 0003) fences (session, lease identity, lease state and expiry,
# attempt running: no worker lock, the run row locked, then the attempt log row) and then either
# answers the log's state or writes a plan computed from a state the caller expects. This process
# remembers each attempt log's state after its last call (and the revision's secret values, which
# a pinned revision never changes), so the usual append is planned here from that state, sent once,
# and written if the log is still in that state (compared under the log row lock). Otherwise the
# function writes nothing and answers the state it found; the plan is then made from it (the
# authoritative one: its refusals are the answer) and sent again under the locks already held.

_CACHE_LIMIT = 4096
#: {attempt id: (the log's state after this process's last call, the revision's secret values)}.
_known: dict[uuid.UUID, tuple[LogState, list[bytes]]] = {}

_APPEND_SQL = (
    "SELECT ql_log_append(%s, %s, %s::bigint, %s, %s::integer, %s, %s::integer, %s::boolean, "
    "%s::jsonb, %s::jsonb, %s::bigint, %s::double precision, %s::double precision, %s, "
    "%s::text[], %s::bigint[], %s::bigint[], %b::bytea[])"
)


def _remember(attempt_id: uuid.UUID, state: LogState, secrets: list[bytes]) -> None:
    if len(_known) >= _CACHE_LIMIT:
        _known.clear()
    _known[attempt_id] = (state, secrets)


def _state_of(data: dict[str, Any]) -> LogState:
    started = data.get("windowStartedAt")
    return LogState(
        next_seq=data["nextSeq"],
        stored_bytes=data["storedBytes"],
        stream_ends=data["ends"],
        stream_newline=data["newline"],
        stream_tails=data["tails"],
        truncated=data["truncated"],
        window_started_at=datetime.fromisoformat(started) if started else None,
        window_bytes=data.get("windowBytes", 0),
    )


def _call(
    args: list[Any], chunk: Chunk, digest: str, expect: LogState | None, plan: Plan | None, want_secrets: bool
) -> dict:
    """One call of ``ql_log_append``: ``plan`` written if the log is in state ``expect``, else
    (and when ``plan`` is None) the log's state answered; ``want_secrets`` asks for the revision's
    secret values too. The bytes go as binary parameters (server-side binding: no quoting of the
    data into the statement's text)."""
    settings = output()
    parts = plan.parts if plan is not None else ()
    params = [
        *args,
        chunk.seq,
        want_secrets,
        Jsonb(expect.continuity()) if expect is not None and plan is not None else None,
        Jsonb(plan.state.continuity()) if plan is not None else None,
        chunk.size if plan is not None and plan.counted else None,
        settings.log_rate_bytes_per_second * RATE_WINDOW_SECONDS,
        RATE_WINDOW_SECONDS,
        digest,
        [part.stream for part in parts] or None,
        [part.offset for part in parts] or None,
        [part.position for part in parts] or None,
        [part.data for part in parts] or None,
    ]
    raw = psycopg.Cursor(connection.connection)  # server-side binding, in the write path's transaction
    # Django's cursor wrapper: its error mapping (lock_timeout) and, when on, query logging.
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    cursor = wrap(raw)  # type: ignore[arg-type]
    with cursor:
        cursor.execute(_APPEND_SQL, params)
        answer = cursor.fetchone()[0]
    return json.loads(answer) if isinstance(answer, str) else answer


def _append_in_database(
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    *,
    chunk: Chunk,
) -> AppendResult | None:
    """The append through ``ql_log_append``; None when the ORM path must answer (nothing written).

    Called inside ``log_append``'s transaction. A plan from the remembered state is sent at once
    unless it could not be made there (a ``seq`` below the log's, a refusal — the state may be
    old —, or a secret that straddles into stored rows); at most three calls, then the ORM path.
    """
    settings = output()
    args: list[Any] = [
        worker_id,
        session_id,
        generation,
        attempt_id,
        lease_generation,
        token_digest(lease_token, worker_id=worker_id),
    ]
    digest = chunk.sha256()
    known = _known.get(attempt_id)
    plan: Plan | None = None
    expect: LogState | None = None
    if known is not None and chunk.seq >= known[0].next_seq:
        try:
            plan = plan_append(
                known[0],
                chunk,
                digest=digest,
                previous=None,
                secrets=known[1],
                now=None,  # the function applies the rate window on the database clock
                max_bytes=settings.log_max_bytes,
                rate_bytes_per_second=settings.log_rate_bytes_per_second,
            )
        except DomainError:
            plan = None  # the remembered state may be old: ask for the log's state
        if plan is not None and (plan.overwrite or not plan.writes):
            plan = None
        expect = known[0] if plan is not None else None
    for _ in range(3):
        answer = _call(args, chunk, digest, expect, plan, known is None)
        status = answer["status"]
        if status == "stored":  # only ever with a plan, hence with a known state
            assert plan is not None and known is not None
            started = answer["windowStartedAt"]
            after = dataclasses.replace(
                plan.state,
                window_started_at=datetime.fromisoformat(started) if started else None,
                window_bytes=answer["windowBytes"],
            )
            _remember(attempt_id, after, known[1])
            return _result(plan.status, after)
        if status != "state":
            return None
        state = _state_of(answer["state"])
        secrets = known[1] if known is not None else rules.secret_values(answer["env"], answer["secretEnv"])
        known = (state, secrets)
        _remember(attempt_id, state, secrets)
        plan = plan_append(
            state,
            chunk,
            digest=digest,
            previous=answer.get("previous"),
            secrets=secrets,
            now=datetime.fromisoformat(answer["now"]),
            max_bytes=settings.log_max_bytes,
            rate_bytes_per_second=settings.log_rate_bytes_per_second,
        )  # read under the locks this transaction holds: its refusals are the answer
        if not plan.writes:
            return _result(plan.status, state)
        for stream, count in plan.overwrite.items():
            _overwrite_stored_end(attempt_id, stream, count)
        expect = state
    return None


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
