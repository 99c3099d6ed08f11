"""Transactions, the database clock and bounded retry for the two storage profiles (ADR-0012 §6).

Every public write path is decorated with :func:`write_path`: it runs the function in exactly one
``transaction.atomic(durable=True)`` and retries the *whole* transaction, with jittered backoff,
when the store reports a transient race:

* SQLite (standalone): ``database is locked`` after the busy timeout. Transactions begin
  IMMEDIATE (settings), so writers are serialised and a read-check-write cannot interleave.
  Within the one standalone process, write paths also queue on an in-process lock before
  ``BEGIN IMMEDIATE``: SQLite's busy handler polls with sleeps, so contending threads mostly
  sleep; a queue hands the lock on at once (``docs/sessions.md``, Storage). Other processes
  (``manage.py sweep``, a second server by mistake) still meet SQLite's own lock, busy timeout
  and this retry.
* PostgreSQL (cluster-control): deadlock and serialization failures, and a lease function's
  ``QL409`` (a row changed under it). A lock wait longer than the connection's ``lock_timeout``
  is not retried: it surfaces as ``lock_timeout`` (503).

* Both: a unique-constraint race a service detects on insert (two transactions inserting the
  same key, where the loser must re-read and answer a replay or a conflict). The service raises
  :class:`UniqueRace`; the re-run sees the winner's committed row.

After the retry budget the caller gets ``storage_busy`` (503) — never a 500. Every retry is
logged (``core.db``, level WARNING) with the service name and the attempt number.

A service that must *commit* an audit row and still refuse the request returns
``Refusal(error)``; the decorator commits, then raises the error.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar, cast, overload

import psycopg
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    IntegrityError,
    OperationalError,
    connection,
    connections,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper, PyFormat, Transformer
from psycopg.pq import ConnStatus, ExecStatus, Format
from psycopg.pq.abc import PGresult
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from core.conf import protocol
from core.errors import DomainError

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# PostgreSQL SQLSTATEs that mean "the same transaction may well succeed if run again":
# serialization_failure, deadlock_detected, and QL409 — a lease function (leases/0004…0011) found
# a row it had read changed when it came to write it (it rolled everything back; a fresh run
# reads the row again), which a 500 would answer for no reason.
_PG_RETRYABLE = {"40001", "40P01", "QL409"}
_PG_LOCK_NOT_AVAILABLE = "55P03"


class UniqueRace(Exception):
    """Raised by a service body when an insert lost a unique-constraint race (ADR-0012 §6).

    ``write_path`` rolls the transaction back and runs it again, so the re-run reads the row the
    winner committed and answers from it. Raise it only where re-reading settles the question.
    """


#: Write paths of this process queue here before ``BEGIN IMMEDIATE`` on SQLite (see above).
#: Re-entrant, so a write path that (in tests) runs inside another cannot block itself.
_SQLITE_WRITERS = threading.RLock()


@contextmanager
def _sqlite_writer_turn() -> Iterator[None]:
    """Wait (at most the busy timeout) for this process's SQLite writer turn; no-op elsewhere."""
    if connection.vendor != "sqlite":
        yield
        return
    timeout = float(connection.settings_dict.get("OPTIONS", {}).get("timeout", 5.0))
    if not _SQLITE_WRITERS.acquire(timeout=timeout):
        raise OperationalError("database is locked (waited for this process's writer turn)")
    try:
        yield
    finally:
        _SQLITE_WRITERS.release()


@dataclass(frozen=True)
class Refusal:
    """Returned by a service body to commit what it wrote (an audit row) and then raise ``error``."""

    error: DomainError


def _sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None)


def is_transient(exc: BaseException) -> bool:
    """True for store errors that a fresh run of the same transaction may not hit again."""
    if isinstance(exc, UniqueRace):
        return True
    if connection.vendor == "sqlite":
        return isinstance(exc, OperationalError) and "locked" in str(exc)
    if isinstance(exc, DatabaseError):
        return _sqlstate(exc) in _PG_RETRYABLE
    return False


def _log_retry(retry_state: RetryCallState, service: str) -> None:
    """One log line per retried transaction: which service, which attempt failed, and how."""
    exc = retry_state.outcome.exception() if retry_state.outcome else None
    log.warning(
        "transient storage race in %s (attempt %d): %s; retrying",
        service,
        retry_state.attempt_number,
        type(exc).__name__ if exc is not None else "?",
    )


def _before_retry(retry_state: RetryCallState, service: str) -> None:
    """Called before each retry's wait; a module-level name so tests can observe retries."""
    _log_retry(retry_state, service)


@overload
def write_path(fn: Callable[P, R]) -> Callable[P, R]: ...


@overload
def write_path(*, database_path: Callable[..., R | None]) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def write_path(
    fn: Callable[P, R] | None = None, *, database_path: Callable[..., R | None] | None = None
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Run ``fn`` as one durable transaction with a bounded, jittered retry on transient races.

    Use as ``@write_path`` or ``@write_path(database_path=g)``. ``g`` (PostgreSQL only) takes the
    same arguments as ``fn`` and does the common case with one statement — a call of a server
    function — answering ``fn``'s result, or None when it wrote nothing and ``fn`` must answer.
    It runs first, outside ``transaction.atomic``: on an autocommit connection the statement is
    its own transaction, one round trip with no ``BEGIN``/``COMMIT`` and no row lock held while
    the client is scheduled (docs/performance.md). Inside a caller's transaction (tests) it simply
    joins it. Both share the retry below, and ``fn`` runs in its own transaction after a None.

    Attempts: ``QINGLONG_SQLITE_BUSY_RETRIES`` (at least 1) in total, with a full-jitter
    exponential wait between them (20 ms base, at most 0.5 s each). Errors raised: whatever ``fn``
    (or ``g``) raises; ``DomainError("storage_busy")`` (503, ``Retry-After: 1``) once the attempts
    are spent on ``database is locked``, a PostgreSQL deadlock/serialization failure, a lease
    function's ``QL409`` (a row changed under it) or a :class:`UniqueRace`;
    ``DomainError("lock_timeout")`` (503) when PostgreSQL refuses a lock after ``lock_timeout``
    (not retried: the lock holder is slow, not racing). ADR-0012 §6.
    """
    if fn is None:
        return functools.partial(write_path, database_path=database_path)

    def once(args, kwargs) -> R:
        if database_path is not None and connection.vendor == "postgresql":
            outcome = database_path(*args, **kwargs)
            if outcome is not None:
                return outcome
        with _sqlite_writer_turn(), transaction.atomic(durable=True):
            return fn(*args, **kwargs)

    def retried(args, kwargs, failure: BaseException) -> R:
        # The first attempt's failure is replayed into tenacity as its attempt 1, so the budget,
        # the waits and the log lines are exactly tenacity's; only a failure pays for them.
        retrying = Retrying(
            stop=stop_after_attempt(max(1, protocol().sqlite_busy_retries)),
            wait=wait_random_exponential(multiplier=0.02, max=0.5),
            retry=retry_if_exception(is_transient),
            before_sleep=lambda state: _before_retry(state, fn.__qualname__),
            reraise=True,
        )
        replay = [failure]
        for attempt in retrying:
            with attempt:
                if replay:
                    raise replay.pop()
                outcome = once(args, kwargs)
        return outcome

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            failure: BaseException | None = None
            try:
                outcome = once(args, kwargs)
            except Exception as exc:  # is_transient decides; anything else is raised as it was
                if not is_transient(exc):
                    raise
                failure = exc
            if failure is not None:
                # Outside the handler: a later attempt's error must not carry this one as its
                # __context__ (core.dependencies would read a bug as the store's outage).
                outcome = retried(args, kwargs, failure)
        except OperationalError as exc:
            refusal = lock_timeout_refusal(exc)
            if refusal is not None:
                raise refusal from exc
            if is_transient(exc):
                log.warning("storage busy after retries in %s", fn.__qualname__)
                raise DomainError("storage_busy", "the database is busy; retry", retry_after=1) from exc
            raise
        except DatabaseError as exc:
            if is_transient(exc):
                log.warning("storage busy after retries in %s", fn.__qualname__)
                raise DomainError("storage_busy", "the database is busy; retry", retry_after=1) from exc
            raise
        except UniqueRace as exc:
            log.warning("unique race unresolved after retries in %s", fn.__qualname__)
            raise DomainError("storage_busy", "the database is busy; retry", retry_after=1) from exc
        if isinstance(outcome, Refusal):
            raise outcome.error
        return outcome

    return wrapper


def lock_timeout_refusal(exc: BaseException) -> DomainError | None:
    """``DomainError("lock_timeout")`` (503, ``Retry-After: 1``) when ``exc`` is PostgreSQL refusing
    a row lock after the connection's ``lock_timeout`` (55P03), else None. Such a wait is not
    retried: the lock holder is slow, not racing (:func:`write_path`)."""
    if isinstance(exc, OperationalError) and _sqlstate(exc) == _PG_LOCK_NOT_AVAILABLE:
        return DomainError("lock_timeout", "a row lock was not granted in time; retry", retry_after=1)
    return None


def db_now() -> datetime:
    """The database's clock as an aware UTC datetime (ADR-0012 §3, docs/leases.md, Locks and transactions).

    PostgreSQL: ``statement_timestamp()`` — call it *after* taking the transaction's row locks,
    so a lock wait cannot make lease times stale. SQLite: the single process's clock as SQLite
    reports it. Worker clocks are never used for lease decisions.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


def is_unique_violation(exc: IntegrityError) -> bool:
    """True when an IntegrityError is a unique-constraint race (for callers that map it)."""
    return _sqlstate(exc) == "23505" or "UNIQUE constraint failed" in str(exc)


def prepared_row(sql: str, params: list | dict) -> tuple | None:
    """PostgreSQL: run ``sql`` as a prepared statement and return its first row, or None.

    ``sql``'s placeholders are ``%b`` (or ``%(name)b`` with a dict of ``params``): bound on the
    server in the binary format, never quoted into the text, so each one is cast to its type in
    the SQL (a bound ``str`` is ``text``, not a UUID; :func:`typed_call`). The statement is
    prepared once per connection (psycopg's ``prepare=True``; ``qinglong.settings`` sets the
    ``prepare_threshold`` that honours it, docs/performance.md "The function calls were never
    prepared"), so the server neither parses nor plans it again; outside a transaction with a
    list of ``params`` it is prepared and executed through the connection's libpq handle
    (:class:`_Statements`), past psycopg's cursor, whose bookkeeping in Python was a fifth of a
    claimer's CPU (docs/performance.md, "A statement past the cursor"). It runs in the caller's
    transaction (or is its own, on an autocommit connection), errors surface as Django's database
    errors (so :func:`write_path` retries and maps them as for any statement), a kept connection
    gets Django's once-per-request health check as a cursor would (``CONN_HEALTH_CHECKS``), and it
    is recorded in ``connection.queries`` when queries are logged, so the query-count budgets
    still count it. ``params``: psycopg-adaptable values (lists → arrays, ``timedelta`` → interval).
    A failed call outside a transaction drops the connection's prepared statements
    (:func:`_deallocate_all`); one that failed because its cached plan went stale, or because its
    prepared statement is gone from the session, is run once more, prepared afresh. Errors
    raised: Django's ``DatabaseError`` family.
    """
    db = connections[DEFAULT_DB_ALIAS]  # this thread's connection, looked up once
    db.close_if_health_check_failed()  # as Django's cursor() does (CONN_HEALTH_CHECKS)
    db.ensure_connection()
    started = time.monotonic()
    try:
        row = _execute_prepared(db, sql, params)
    except DatabaseError as exc:
        if db.in_atomic_block:
            raise  # the caller's rollback makes psycopg deallocate them all (ROLLBACK)
        _deallocate_all()
        if _sqlstate(exc) not in _PG_PREPARED_GONE:
            raise
        row = _execute_prepared(db, sql, params)  # prepared afresh against the schema as it is now
    if db.queries_logged:
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return row


#: A prepared statement that cannot run as prepared: "cached plan must not change result type"
#: (0A000: another process changed what it reads, a column's or a function's result type, since
#: this connection prepared it), or "prepared statement does not exist" (26000: the session's
#: statements were dropped under it, by ``DEALLOCATE ALL`` or ``DISCARD ALL``).
_PG_PREPARED_GONE = frozenset({"0A000", "26000"})


def _execute_prepared(db: BaseDatabaseWrapper, sql: str, params: list | dict) -> tuple | None:
    conn = db.connection
    if isinstance(params, dict) or not conn.autocommit or conn.prepare_threshold is None:
        # In a transaction: psycopg's cursor, which opens it (BEGIN) before the first statement.
        # Preparing turned off (QINGLONG_PG_PREPARED_STATEMENTS=false, for a pooler in transaction
        # mode, whose server connections — and statement names — are shared between clients):
        # the cursor, which then prepares nothing.
        with db.wrap_database_errors, psycopg.Cursor(conn) as cursor:
            cursor.execute(sql, params, prepare=True, binary=True)
            return cursor.fetchone()
    with db.wrap_database_errors:
        return _Statements.of(conn).run(sql, params)


class _Statements:
    """The statements :func:`prepared_row` prepared on one autocommit connection, run through its
    libpq handle (``psycopg.pq``): the parameters dumped by psycopg's transformer (its adapters,
    :class:`Bound` included), ``PQprepare`` once per (SQL, parameter types), then ``PQexecPrepared``
    (which lets go of the GIL while it waits) and the first row loaded by the same transformer.

    What psycopg's cursor adds — the query converted on every call, its prepared-statement cache
    looked up, results checked and selected in Python — was about a fifth of an in-process claim
    → release loop's CPU (docs/performance.md, "A statement past the cursor"). Only for a
    statement that is its own transaction (in one, psycopg's cursor must send its ``BEGIN``), on
    a connection that prepares (``prepare_threshold`` set) and never ``LISTEN``s (a notification
    arriving during the call is left for psycopg's next read: the waiting claims listen on a
    connection of their own, ``api.waiting``). The call blocks in libpq: a KeyboardInterrupt
    waits for the statement's end (the server's ``lock_timeout`` and ``statement_timeout``
    bound it), where psycopg's wait would cancel the query.

    A connection lost during the call (a restart, a failover, ``pg_terminate_backend``) is
    raised as psycopg's ``OperationalError`` whatever libpq's last result says — often "server
    closed the connection unexpectedly", with no SQLSTATE — so that it is the 503 of a database
    outage (``core.dependencies``), as through the cursor.

    They are kept on the psycopg connection itself (a pooled one serves many requests and keeps
    its statements), so they go with it: a mapping keyed by the connection would keep every
    connection a thread left behind open through the transformer's reference to it.
    ``_deallocate_all`` forgets them.
    """

    __slots__ = ("conn", "names", "transformer")
    _ATTRIBUTE = "_qinglong_statements"

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.names: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self.transformer = Transformer(conn)

    @classmethod
    def of(cls, conn: psycopg.Connection) -> _Statements:
        """``conn``'s statements (made on first use)."""
        found = getattr(conn, cls._ATTRIBUTE, None)
        if found is None:
            found = cls(conn)
            setattr(conn, cls._ATTRIBUTE, found)
        return found

    @classmethod
    def forget(cls, conn: psycopg.Connection) -> None:
        """Forget ``conn``'s statements (the server dropped them, or is about to)."""
        if hasattr(conn, cls._ATTRIBUTE):
            delattr(conn, cls._ATTRIBUTE)

    def run(self, sql: str, params: list) -> tuple | None:
        """``sql`` (``%b`` placeholders, ``%%`` for a ``%``) with ``params``: its first row, or
        None. Raises psycopg's error for the server's answer, ``OperationalError`` for a
        connection that failed, ``ProgrammingError`` for placeholders that do not match
        ``params`` (as psycopg's cursor does)."""
        text, placeholders = _numbered(sql)
        if placeholders != len(params):
            raise psycopg.ProgrammingError(
                f"the query has {placeholders} placeholders but {len(params)} parameters were passed"
            )
        transformer = self.transformer
        values = transformer.dump_sequence(params, [PyFormat.BINARY] * len(params))
        types = tuple(transformer.types or ())
        with self.conn.lock:
            pgconn = self.conn.pgconn
            name = self.names.get((sql, types))
            if name is None:
                name = f"ql_{len(self.names)}".encode()
                self._check(pgconn.prepare(name, text, param_types=types))
                self.names[(sql, types)] = name
            result = self._check(
                pgconn.exec_prepared(
                    name,
                    cast("Sequence[Buffer]", values),  # None is a NULL, as psycopg's cursor sends it
                    param_formats=transformer.formats,
                    result_format=Format.BINARY,
                )
            )
            if not result.ntuples:
                return None
            transformer.set_pgresult(result)
            return transformer.load_row(0, tuple)

    def _check(self, result: PGresult) -> PGresult:
        if result.status in (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK):
            return result
        error = psycopg.errors.error_from_result(result, encoding=self.conn.info.encoding)
        if self.conn.pgconn.status == ConnStatus.BAD and not isinstance(error, psycopg.OperationalError):
            raise psycopg.OperationalError(f"the connection was lost: {error}") from error
        raise error


_PLACEHOLDER = re.compile(r"%%|%b|%")


@functools.cache
def _numbered(sql: str) -> tuple[bytes, int]:
    """``sql`` with its ``%b`` placeholders numbered as the server's (``$1``, ``$2``, …) and
    ``%%`` as ``%``; and how many placeholders it has. Raises ``ProgrammingError`` for any other
    ``%`` (``%s``, ``%(name)b``: this path binds a list, in the binary format)."""
    parts: list[str] = []
    count = 0
    position = 0
    for found in _PLACEHOLDER.finditer(sql):
        parts.append(sql[position : found.start()])
        position = found.end()
        if found.group() == "%%":
            parts.append("%")
        elif found.group() == "%b":
            count += 1
            parts.append(f"${count}")
        else:
            raise psycopg.ProgrammingError(
                f"only %b placeholders are bound here: {sql[found.start() :][:20]!r}"
            )
    parts.append(sql[position:])
    return "".join(parts).encode(), count


def _deallocate_all() -> None:
    """After a failed call on an autocommit connection: drop the connection's prepared statements.

    A statement whose first execution fails stays prepared on the server under a name psycopg has
    forgotten (it prepares it again under a new one next time), and nothing rolls back to clear it;
    a stale one (``0A000``) would fail on every call. ``DEALLOCATE ALL`` sent through psycopg also
    empties psycopg's own cache, so every call is prepared again on its next use. Best effort: a
    closed or broken connection (an outage) is skipped, and Django replaces it.
    """
    raw = connection.connection
    if raw is None or raw.closed:  # closed, or broken by an outage
        return  # its statements went with it
    _Statements.forget(raw)
    try:
        raw.execute("DEALLOCATE ALL")
    except psycopg.Error:
        log.warning("could not deallocate this connection's prepared statements", exc_info=True)


class Bound:
    """A parameter dumped once, bound as those bytes on every call (:func:`bound`). Its class
    carries the value's type ``oid`` and wire ``format`` (binary, or text for what psycopg dumps
    as text, such as an empty list): one subclass per pair (:func:`_bound_class`)."""

    __slots__ = ("data",)
    oid: int = 0
    format: Format = Format.BINARY

    def __init__(self, data: bytes) -> None:
        self.data = data


@functools.cache
def _bound_class(oid: int, format: Format) -> type[Bound]:  # noqa: A002 - psycopg's name
    return type(f"Bound{oid}{format.name.title()}", (Bound,), {"__slots__": (), "oid": oid, "format": format})


class _BoundDumper(Dumper):
    """psycopg's dumper of :class:`Bound`: the bytes as they are, under the type and format its
    class carries (psycopg makes one dumper per class it meets)."""

    format = Format.BINARY

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        kind = cast(type[Bound], cls)  # registered for Bound: psycopg meets its subclasses only
        self.oid, self.format = kind.oid, kind.format

    def dump(self, obj: Bound) -> bytes:
        return obj.data


psycopg.adapters.register_dumper(Bound, _BoundDumper)


def bound(value: object) -> Bound:
    """``value`` (any psycopg-adaptable value: a list becomes an array) dumped now, as psycopg
    dumps a ``%b`` parameter of :func:`prepared_row`, for a value that repeats over many calls:
    psycopg would otherwise inspect and dump it on each (it walks a list's elements in Python to
    find their type). Raises psycopg's ``ProgrammingError`` if ``value`` cannot be adapted."""
    dumper = Transformer(psycopg.adapters).get_dumper(value, PyFormat.BINARY)
    data = dumper.dump(value)
    return _bound_class(dumper.oid, Format(dumper.format))(b"" if data is None else bytes(data))


def call_function(sql: str, params: list) -> tuple:
    """PostgreSQL: run ``sql`` (one ``SELECT f(%b::t, …)``, …; :func:`typed_call` writes such a
    call) with :func:`prepared_row` and return its one row; for the hot paths' server functions
    (docs/performance.md, "Where the time goes"). Raises ``DatabaseError`` if it answers no row.
    """
    row = prepared_row(sql, params)
    if row is None:
        raise DatabaseError(f"{sql[:60]}… answered no row")
    return row


def typed_call(function: str, types: str) -> str:
    """``SELECT function(%b::t1, %b::t2, …)`` for :func:`call_function`: every parameter cast to the
    function's argument type (``types``: the comma-separated list, as ``\\df`` shows it), since a
    parameter bound in the binary format carries its own type (a ``str`` is ``text``, not a UUID)."""
    casts = ", ".join(f"%b::{kind.strip()}" for kind in types.split(","))
    return f"SELECT {function}({casts})"
