"""Transactions, retries and the database clock (ADR-0012 §6), with real second connections.

SQLite: another connection holding the write lock makes a write path retry a bounded number of
times with jitter, then answer 503 ``storage_busy`` — or succeed once the lock is let go.
PostgreSQL: deadlock/serialization failures are retried the same way, a lock wait past
``lock_timeout`` answers 503 ``lock_timeout`` at once, every session write path locks the worker
row before it reads the session, and lease times are read from the clock after the lock.
"""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
import weakref
from datetime import UTC, timedelta

import psycopg
import pytest
from django.db import DatabaseError, OperationalError, ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext

import core.db
from actions.sessions.expiry import session_expire
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.registration import session_register
from actions.sessions.shutdown import session_drain, session_offline, session_operator_offline
from core.db import UniqueRace, db_now, write_path
from core.dependencies import dependency_error
from core.errors import DomainError
from protocol import wire
from protocol.ids import uuid7
from tests.helpers import SignedClient, enrolled_worker, register, snapshot, snapshot_rows
from workers.models import Worker, WorkerSession

pytestmark = pytest.mark.django_db
#: Tests that use a second connection need the first one's writes committed.
real_transactions = pytest.mark.django_db(transaction=True)


@pytest.fixture
def retries(monkeypatch):
    """Count the retries ``write_path`` makes (its ``_before_retry`` hook), still logging them."""
    seen: list[int] = []
    real = core.db._before_retry

    def counting(state, service):
        seen.append(state.attempt_number)
        real(state, service)

    monkeypatch.setattr(core.db, "_before_retry", counting)
    return seen


# --- SQLite: a real second connection holds the write lock --------------------------------------


@pytest.fixture
def short_busy_timeout():
    """Reconnect Django with a 50 ms SQLite busy timeout (the default is 5 s)."""
    options = connection.settings_dict["OPTIONS"]
    saved = options.get("timeout")
    connection.close()
    options["timeout"] = 0.05
    yield
    connection.close()
    options["timeout"] = saved


@pytest.fixture
def write_lock_holder():
    """A second SQLite connection that takes the write lock (BEGIN IMMEDIATE) and can let it go."""
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA busy_timeout = 5000")

    class Holder:
        def take(self):
            holder.execute("BEGIN IMMEDIATE")

        def release(self):
            if holder.in_transaction:
                holder.execute("ROLLBACK")

    yield Holder()
    holder.close()


@real_transactions
@pytest.mark.sqlite
def test_sqlite_write_lock_held_elsewhere_retries_then_answers_storage_busy(
    short_busy_timeout, write_lock_holder, retries, protocol_settings, caplog
):
    protocol_settings(SQLITE_BUSY_RETRIES=4)
    worker = enrolled_worker()
    before = snapshot_rows()
    write_lock_holder.take()
    started = time.monotonic()
    with pytest.raises(DomainError) as refused:
        register(worker)
    elapsed = time.monotonic() - started
    write_lock_holder.release()
    assert (refused.value.code, refused.value.status, refused.value.retry_after) == ("storage_busy", 503, 1)
    assert retries == [1, 2, 3]  # four attempts in all, three waits between them
    assert elapsed < 3  # bounded: 4 × 50 ms busy timeout + at most 3 × 0.5 s jittered waits
    assert sum("transient storage race in session_register" in r.getMessage() for r in caplog.records) == 3
    assert snapshot_rows() == before


@real_transactions
@pytest.mark.sqlite
def test_sqlite_storage_busy_over_http_is_a_503_with_retry_after(
    client, short_busy_timeout, write_lock_holder, protocol_settings
):
    protocol_settings(SQLITE_BUSY_RETRIES=2)
    session = register(enrolled_worker())
    api = SignedClient(client, session.worker)
    write_lock_holder.take()
    try:  # a slot change must write
        answer = api.post(
            wire.SESSION_HEARTBEAT, {**session.fence(), "expectedVersion": 0, "availableSlots": 1}
        )
    finally:
        write_lock_holder.release()
    assert answer.status_code == 503
    assert answer.json() == {"code": "storage_busy", "message": "the database is busy; retry", "field": None}
    assert answer["Retry-After"] == "1"


@real_transactions
@pytest.mark.sqlite
def test_sqlite_write_succeeds_when_the_lock_is_let_go_during_the_retries(
    short_busy_timeout, write_lock_holder, monkeypatch, protocol_settings
):
    protocol_settings(SQLITE_BUSY_RETRIES=4)
    worker = enrolled_worker()
    real = core.db._before_retry
    waits = []

    def release_on_first_retry(state, service):
        waits.append(state.attempt_number)
        real(state, service)
        write_lock_holder.release()

    monkeypatch.setattr(core.db, "_before_retry", release_on_first_retry)
    write_lock_holder.take()
    session = register(worker)
    assert waits == [1] and session.generation == 1
    assert WorkerSession.objects.filter(pk=session.session_id).exists()


@real_transactions
@pytest.mark.sqlite
def test_sqlite_transactions_begin_immediate():
    """A write path holds the write lock from its first statement (no read-then-upgrade race)."""
    worker = enrolled_worker()
    probe = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=0)
    seen = {}

    @write_path
    def read_only_body():
        Worker.objects.filter(pk=worker.worker_id).exists()  # a read, yet the lock is taken
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            seen["locked"] = False
        except sqlite3.OperationalError as exc:
            seen["locked"] = "locked" in str(exc)

    read_only_body()
    probe.close()
    assert seen == {"locked": True}


# --- both stores ---------------------------------------------------------------------------------


def test_a_unique_race_reruns_the_transaction_and_is_bounded(retries, protocol_settings):
    protocol_settings(SQLITE_BUSY_RETRIES=3)
    calls = []

    @write_path
    def loses_twice():
        calls.append(Worker.objects.count())
        if len(calls) < 3:
            Worker.objects.create(name=f"rolled-back-{len(calls)}")
            raise UniqueRace("lost")
        return len(calls)

    assert loses_twice() == 3
    assert retries == [1, 2]
    assert not Worker.objects.filter(name__startswith="rolled-back").exists()  # each try rolled back

    @write_path
    def always_loses():
        raise UniqueRace("lost")

    with pytest.raises(DomainError) as refused:
        always_loses()
    assert refused.value.code == "storage_busy"


def test_an_error_on_a_retried_attempt_is_not_read_as_the_first_attempts_race(retries, protocol_settings):
    """A bug met on a re-run stays a bug (a 500 with its traceback): it does not carry the first
    attempt's transient race as its context, which core.dependencies would read as an outage."""
    protocol_settings(SQLITE_BUSY_RETRIES=3)
    calls = []

    @write_path
    def races_then_breaks():
        calls.append(1)
        if len(calls) == 1:
            raise UniqueRace("lost")
        raise KeyError("a programming error on the re-run")

    with pytest.raises(KeyError) as raised:
        races_then_breaks()
    assert len(calls) == 2 and retries == [1]
    assert raised.value.__context__ is None
    assert dependency_error(raised.value) is None


def test_db_now_is_the_database_clock_in_utc_read_when_called():
    """Aware UTC; on PostgreSQL the statement's time, not the transaction's start (which a lock
    wait would make stale)."""
    with transaction.atomic():
        first = db_now()
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_sleep(0.05)")
            else:
                time.sleep(0.05)
        second = db_now()
    assert first.utcoffset() == second.utcoffset() == timedelta(0)
    assert second - first >= timedelta(milliseconds=45)
    assert abs(second.timestamp() - time.time()) < 5


# --- PostgreSQL ------------------------------------------------------------------------------------


def pg_conninfo() -> dict:
    params = connection.get_connection_params()
    return {key: params[key] for key in ("host", "port", "user", "password", "dbname") if params.get(key)}


@real_transactions
@pytest.mark.postgres
def test_pg_a_server_function_call_is_prepared_once_per_connection_and_other_queries_are_not():
    """call_function asks psycopg to prepare (docs/performance.md): Django's default
    ``prepare_threshold`` (None) would silently send Parse for the call every time."""
    sql = core.db.typed_call("pg_catalog.abs", "integer")
    connection.close()
    for value in (-1, -2, -3):
        assert core.db.call_function(sql, [value]) == (-value,)
    Worker.objects.filter(name="unprepared").exists()
    Worker.objects.filter(name="unprepared").exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert prepared == ["SELECT pg_catalog.abs($1::integer)"]


BOUND_VALUES = [
    ([], "text[]"),
    ([], "integer[]"),
    ([], "uuid[]"),
    ([3, None, -7, 2**31 - 1], "integer[]"),
    ([2**40], "bigint[]"),
    (['a"b\\c{}', "é, \u00e9", "", "NULL"], "text[]"),
    ([uuid7(), uuid7()], "uuid[]"),
    (timedelta(seconds=90.5), "interval"),
]


def _reads_back(value, kind) -> None:
    sql = f"SELECT %b::{kind}"
    once = core.db.bound(value)
    assert core.db.prepared_row(sql, [value]) == (value,)
    assert core.db.prepared_row(sql, [once]) == (value,)
    assert core.db.prepared_row(sql, [once]) == (value,)


@pytest.mark.postgres
@pytest.mark.parametrize(("value", "kind"), BOUND_VALUES)
def test_pg_a_bound_parameter_reads_back_as_the_value_bound_on_each_call(value, kind):
    """``core.db.bound`` (dumped once, the claim's repeating arrays) binds what psycopg's own
    dump of the value binds: the same value reads back, empty lists (which psycopg sends as text)
    and quoting included, and both go through the same prepared statement. In a transaction:
    psycopg's cursor."""
    _reads_back(value, kind)


@real_transactions
@pytest.mark.postgres
@pytest.mark.parametrize(("value", "kind"), BOUND_VALUES)
def test_pg_a_statement_of_its_own_binds_and_reads_back_as_the_cursor_does(value, kind):
    """The same values outside a transaction, where the statement runs through the connection's
    libpq handle (``core.db._Statements``): what psycopg's cursor binds and reads back, a NULL
    beside it included."""
    _reads_back(value, kind)
    assert core.db.prepared_row(f"SELECT %b::{kind}, %b::uuid", [value, None]) == (value, None)


@real_transactions
@pytest.mark.postgres
def test_pg_a_statement_of_its_own_runs_in_no_transaction_and_one_in_a_transaction_in_it():
    """Outside ``atomic`` the call commits on its own; inside, it is the transaction's (psycopg's
    cursor opened it), and rolls back with it."""
    connection.close()
    setting = "SELECT set_config('ql.test', %b::text, %b::boolean)"
    core.db.prepared_row(setting, ["kept", False])  # is_local false: kept by the session
    with pytest.raises(RuntimeError), transaction.atomic():
        assert core.db.prepared_row(setting, ["rolled back", False]) == ("rolled back",)
        raise RuntimeError("roll the transaction back")
    assert core.db.prepared_row("SELECT current_setting(%b::text)", ["ql.test"]) == ("kept",)


@pytest.mark.postgres
def test_pg_a_connection_left_behind_with_its_statements_goes_with_them():
    """A thread that ends without closing its connection leaves it to the garbage collector (which
    closes it); the statements kept for it must not keep it, and its server session, alive."""
    conn = psycopg.connect(**pg_conninfo(), autocommit=True)
    assert core.db._Statements.of(conn).run("SELECT %b::integer", [7]) == (7,)
    gone = weakref.ref(conn)
    del conn
    gc.collect()
    assert gone() is None


@real_transactions
@pytest.mark.postgres
def test_pg_with_preparing_turned_off_nothing_is_prepared():
    """``QINGLONG_PG_PREPARED_STATEMENTS=false`` (a pooler in transaction mode shares server
    connections, and so statement names, between clients): no call prepares a statement."""
    sql = core.db.typed_call("pg_catalog.abs", "integer")
    connection.close()
    connection.ensure_connection()
    connection.connection.prepare_threshold = None  # what the setting makes of every connection
    assert [core.db.call_function(sql, [-n]) for n in (1, 2, 3)] == [(1,), (2,), (3,)]
    assert _prepared_count() == 0


@real_transactions
@pytest.mark.postgres
def test_pg_a_connection_lost_under_a_call_is_a_database_outage():
    """The server ends the session (a restart, a failover, ``pg_terminate_backend``): libpq's last
    answer may carry no SQLSTATE, and the call must still read as an outage — Django's
    ``OperationalError``, the 503 ``database_unavailable`` — not a bug's 500."""
    connection.close()
    assert core.db.prepared_row("SELECT %b::integer", [1]) == (1,)
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**pg_conninfo(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError) as raised:
        core.db.prepared_row("SELECT %b::integer", [2])
    refusal = dependency_error(raised.value)
    assert refusal is not None and refusal.code == "database_unavailable"
    connection.close()  # what Django does with a connection whose call failed so
    assert core.db.prepared_row("SELECT %b::integer", [3]) == (3,)


@real_transactions
@pytest.mark.postgres
def test_pg_placeholders_are_bound_as_the_cursor_binds_them():
    """``%%`` is a ``%``; a count of parameters that does not match, or a placeholder of another
    kind, is a programming error (not a protocol violation read as an outage)."""
    connection.close()
    assert core.db.prepared_row("SELECT 'a%%' || %b::text", ["x"]) == ("a%x",)
    for sql, params in (
        ("SELECT %b::integer", [1, 2]),
        ("SELECT %s::integer", [1]),
        ("SELECT %b::integer", []),
    ):
        with pytest.raises(ProgrammingError):
            core.db.prepared_row(sql, params)
    assert core.db.prepared_row("SELECT %b::integer", [4]) == (4,)


@real_transactions
@pytest.mark.postgres
@pytest.mark.parametrize("drop", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_pg_a_prepared_call_dropped_from_the_session_is_prepared_afresh(drop):
    """Something else on the connection drops its prepared statements (a pool's reset, an
    operator's ``DISCARD ALL``): the next call prepares its statement again instead of failing
    with 26000."""
    sql = core.db.typed_call("pg_catalog.abs", "integer")
    connection.close()
    assert core.db.call_function(sql, [-4]) == (4,)
    connection.ensure_connection()
    connection.connection.execute(drop)
    assert core.db.call_function(sql, [-5]) == (5,)
    assert core.db.call_function(sql, [-6]) == (6,)
    assert _prepared_count() == 1


def _prepared_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return cursor.fetchone()[0]


@real_transactions
@pytest.mark.postgres
def test_pg_a_call_that_fails_leaves_no_prepared_statement_behind():
    """A first execution that fails leaves its statement prepared on the server under a name
    psycopg forgets; repeated, that would pile up on a pooled connection."""
    connection.close()
    sql = "SELECT 1 / %b::integer"
    for _ in range(5):
        with pytest.raises(DatabaseError):
            core.db.prepared_row(sql, [0])
    assert _prepared_count() == 0
    assert core.db.prepared_row(sql, [1]) == (1,)
    assert _prepared_count() == 1


@real_transactions
@pytest.mark.postgres
def test_pg_a_prepared_call_gone_stale_by_another_connections_change_is_prepared_afresh():
    """Another process (a migration on another replica) changes the result type of what a
    prepared statement reads: the next call would fail with 0A000 on every call until the
    connection was recycled; it is answered by the current schema instead."""
    other = psycopg.connect(**pg_conninfo(), autocommit=True)
    try:
        other.execute("CREATE FUNCTION ql_test_shape() RETURNS integer LANGUAGE sql AS 'SELECT 1'")
        connection.close()
        assert core.db.prepared_row("SELECT ql_test_shape()", []) == (1,)
        other.execute("DROP FUNCTION ql_test_shape()")
        other.execute("CREATE FUNCTION ql_test_shape() RETURNS text LANGUAGE sql AS $$SELECT 'two'$$")
        assert core.db.prepared_row("SELECT ql_test_shape()", []) == ("two",)
        assert core.db.prepared_row("SELECT ql_test_shape()", []) == ("two",)
    finally:
        other.execute("DROP FUNCTION IF EXISTS ql_test_shape()")
        other.close()


def raise_sqlstate(code: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{code}'; END $$")


@real_transactions
@pytest.mark.postgres
@pytest.mark.parametrize("sqlstate", ["40001", "40P01"], ids=["serialization_failure", "deadlock_detected"])
def test_pg_transient_failures_are_retried_then_storage_busy(sqlstate, retries, protocol_settings):
    protocol_settings(SQLITE_BUSY_RETRIES=3)
    calls = []

    @write_path
    def fails_once():
        calls.append(1)
        Worker.objects.create(name=f"try-{len(calls)}")
        if len(calls) == 1:
            raise_sqlstate(sqlstate)
        return len(calls)

    assert fails_once() == 2
    assert list(Worker.objects.values_list("name", flat=True)) == ["try-2"]

    @write_path
    def always_fails():
        raise_sqlstate(sqlstate)

    retries.clear()
    with pytest.raises(DomainError) as refused:
        always_fails()
    assert (refused.value.code, refused.value.status) == ("storage_busy", 503)
    assert retries == [1, 2]


@pytest.fixture
def worker_row_locked_elsewhere():
    """Lock a worker row from a second PostgreSQL connection; yields (lock(worker_id), release())."""
    other = psycopg.connect(**pg_conninfo(), autocommit=False)
    released_at = {}

    def lock(worker_id):
        other.execute("SELECT 1 FROM workers_worker WHERE id = %s FOR UPDATE", [worker_id])

    def release():
        released_at["t"] = other.execute("SELECT clock_timestamp()").fetchone()[0]
        other.commit()
        return released_at["t"]

    yield lock, release
    other.rollback()
    other.close()


@real_transactions
@pytest.mark.postgres
def test_pg_lock_wait_past_lock_timeout_is_a_503_lock_timeout_without_retry(
    worker_row_locked_elsewhere, retries
):
    lock, release = worker_row_locked_elsewhere
    session = register(enrolled_worker())
    lock(session.worker.worker_id)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '150ms'")
    before = snapshot_rows()
    try:
        for call in (
            lambda: register(session.worker),
            lambda: session_drain(
                worker_id=session.worker.worker_id,
                session_id=session.session_id,
                generation=1,
                expected_version=0,
            ),
            # (not the heartbeat: on PostgreSQL it is one compare-and-swap statement that takes
            # no worker lock — docs/sessions.md; its fence is in its WHERE clause)
        ):
            with pytest.raises(DomainError) as refused:
                call()
            assert (refused.value.code, refused.value.status) == ("lock_timeout", 503)
            assert refused.value.retry_after == 1  # every 503 says when to come back
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
        release()
    assert retries == []
    assert snapshot_rows() == before


@real_transactions
@pytest.mark.postgres
def test_pg_lease_time_is_read_after_the_worker_lock(worker_row_locked_elsewhere):
    """A registration that waited for the worker lock stamps its lease from after the wait."""
    lock, release = worker_row_locked_elsewhere
    worker = enrolled_worker()
    lock(worker.worker_id)
    done = {}

    def registers():
        try:
            done["session"] = register(worker)
        finally:
            connection.close()

    thread = threading.Thread(target=registers)
    thread.start()
    # wait until the registration is blocked on the lock, observed from the server itself
    with psycopg.connect(**pg_conninfo(), autocommit=True) as observer:
        for _ in range(500):
            waiting = observer.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()[0]
            if waiting:
                break
            time.sleep(0.01)
        assert waiting, "the registration never waited for the worker lock"
    released_at = release()
    thread.join(10)
    stored = WorkerSession.objects.get(pk=done["session"].session_id)
    assert stored.registered_at >= released_at.astimezone(UTC)


# --- lock order: worker row before the session (both stores; FOR UPDATE on PostgreSQL) -------------


def _lock_then_read(queries) -> None:
    sqls = [q["sql"] for q in queries]
    worker_lock = next(i for i, sql in enumerate(sqls) if 'FROM "workers_worker"' in sql)
    session_read = next(i for i, sql in enumerate(sqls) if 'FROM "workers_workersession"' in sql)
    assert worker_lock < session_read, sqls[: session_read + 1]
    if connection.vendor == "postgresql":
        assert "FOR UPDATE" in sqls[worker_lock], sqls[worker_lock]


@pytest.mark.parametrize(
    "call",
    ["register", "replace", "heartbeat-write", "drain", "offline", "operator-offline", "expire"],
)
def test_every_session_write_path_locks_the_worker_before_reading_the_session(call):
    worker = enrolled_worker()
    session = register(worker)
    fence = {"worker_id": worker.worker_id, "session_id": session.session_id, "generation": 1}
    fresh = enrolled_worker()
    if call == "expire":
        WorkerSession.objects.filter(pk=session.session_id).update(
            lease_expires_at=db_now() - timedelta(seconds=1)
        )
    actions = {
        "register": lambda: session_register(
            worker_id=fresh.worker_id,
            session_id=uuid7(),
            capabilities=snapshot(),
            max_concurrent_runs=1,
            available_slots=1,
            software_version="t/1",
            protocol_version=1,
        ),
        "replace": lambda: register(worker),
        "heartbeat-write": lambda: session_heartbeat(**fence, expected_version=0, available_slots=1),
        "drain": lambda: session_drain(**fence, expected_version=0),
        "offline": lambda: session_offline(**fence, expected_version=0),
        "operator-offline": lambda: session_operator_offline(worker_id=worker.worker_id),
        "expire": lambda: session_expire(session_id=session.session_id),
    }
    if call == "heartbeat-write" and connection.vendor == "postgresql":
        pytest.skip(
            "PostgreSQL: the heartbeat is one compare-and-swap statement with its fence in the WHERE "
            "clause and no worker lock (docs/sessions.md); races: tests/workers, tests/concurrency"
        )
    if call == "heartbeat-write":
        # the heartbeat's first, lock-free read decides whether to write; check the write
        with CaptureQueriesContext(connection) as queries:
            actions[call]()
        write_start = next(
            i
            for i, q in enumerate(queries.captured_queries)
            if 'FROM "workers_worker"' in q["sql"] and "workers_workersession" not in q["sql"]
        )
        _lock_then_read(queries.captured_queries[write_start:])
        return
    with CaptureQueriesContext(connection) as queries:
        actions[call]()
    _lock_then_read(queries.captured_queries)
