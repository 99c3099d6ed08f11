"""Wake-ups leave after their write has committed, and a server function's call is its own
transaction (``core.wakeups``, ``core.db.write_path``; docs/performance.md).

A ``NOTIFY`` inside a durable write transaction holds PostgreSQL's one notification lock from that
commit until it is flushed, so every notifying commit queued behind the one before it. These tests
pin what replaced it, with a real LISTEN connection (PostgreSQL) or the in-process subscribers
(SQLite): nothing is sent before the commit or for a rollback, every wake-up of one transaction
leaves in one statement after it, a rolled-back savepoint does not swallow later wake-ups, and the
lease calls' server functions run outside any ``BEGIN`` with the same retry as their Python path.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

import core.db
from core import wakeups
from core.db import write_path
from tests.agent.processes import wait_for
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, release, start

pytestmark = pytest.mark.django_db(transaction=True)

CLASS_A = "a" * 64
CLASS_B = "b" * 64


@pytest.fixture
def heard():
    """(collect, the payloads heard so far): a LISTEN connection on PostgreSQL, the subscribers on
    SQLite."""
    payloads: list[str] = []
    if connection.vendor == "postgresql":
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool"):
            params.pop(key, None)
        params["application_name"] = wakeups.LISTENER_APPLICATION  # as api.waiting's connection
        listener = psycopg.connect(**params, autocommit=True)
        listener.execute(f"LISTEN {wakeups.CHANNEL}")

        def collect(timeout: float = 0.3) -> list[str]:
            payloads.extend(n.payload for n in listener.notifies(timeout=timeout, stop_after=100))
            return payloads

        collect.close = listener.close  # the listener goes away
        yield collect
        listener.close()
    else:
        wakeups.subscribe(payloads.append)

        def collect(timeout: float = 0.0) -> list[str]:
            return payloads

        yield collect
        wakeups.unsubscribe(payloads.append)


def _notifies(queries) -> list[str]:
    return [q["sql"] for q in queries if "pg_notify" in q["sql"]]


def test_wake_ups_leave_after_the_commit_all_in_one_statement_and_none_for_a_rollback(heard):
    with CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            wakeups.work_ready(CLASS_A)
            wakeups.worker_changed("w1")
            wakeups.work_ready(CLASS_A)  # the same payload twice is sent once
            assert _notifies(queries.captured_queries) == []  # nothing inside the write transaction
            assert heard() == []
    if connection.vendor == "postgresql":
        assert len(_notifies(queries.captured_queries)) == 1
    wait_for(lambda: sorted(heard()) == sorted([wakeups.WORK_PREFIX + CLASS_A, "w:w1"]), 10, "both wake-ups")
    heard().clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        wakeups.work_ready(CLASS_B)
        raise RuntimeError("roll back")
    assert heard(0.5) == []


def test_a_rolled_back_savepoint_does_not_swallow_the_wake_ups_after_it(heard):
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            wakeups.work_ready(CLASS_A)  # the batch is made inside the savepoint, which rolls back
            raise RuntimeError("roll back the savepoint")
        wakeups.work_ready(CLASS_B)
    wait_for(lambda: wakeups.WORK_PREFIX + CLASS_B in heard(), 10, "the wake-up after the savepoint")
    assert wakeups.WORK_PREFIX + CLASS_A not in heard(0.3)


def test_a_release_and_a_completion_wake_the_worker_and_the_queue_after_they_commit(heard):
    session = register(enrolled_worker())
    revision = make_revision()
    enqueue(revision)
    enqueue(revision)
    worker_wake = wakeups.WORKER_PREFIX + str(session.worker.worker_id)
    work_wake = wakeups.WORK_PREFIX + revision.placement_sha256
    wait_for(lambda: work_wake in heard(), 10, "the enqueue wake-up")
    heard().clear()
    release(claim_one(session))
    wait_for(lambda: {worker_wake, work_wake} <= set(heard()), 10, "the release's wake-ups")
    heard().clear()
    complete(start(claim_one(session)))
    wait_for(lambda: worker_wake in heard(), 10, "the completion's wake-up")


@pytest.mark.postgres
def test_a_lease_call_on_postgresql_is_one_statement_outside_any_begin(protocol_settings):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    session = register(enrolled_worker())
    revision = make_revision()
    enqueue(revision)
    enqueue(revision)
    complete(start(claim_one(session)))  # this process learns the placement class and the template
    with CaptureQueriesContext(connection) as queries:
        held = claim_one(session)
    sqls = [q["sql"] for q in queries.captured_queries]
    assert sqls and all("ql_lease_claim" in sql for sql in sqls), sqls
    assert held.lease_generation == 1
    with CaptureQueriesContext(connection) as queries:
        release(held)
    sqls = [q["sql"] for q in queries.captured_queries]
    # nobody listens (no waiting claims anywhere): no wake-up statement after the commit
    assert [("ql_lease_release" in sql, "pg_notify" in sql) for sql in sqls] == [(True, False)]


@pytest.mark.postgres
def test_a_release_and_a_completion_send_wake_ups_only_while_some_connection_listens(
    heard, protocol_settings
):
    """With a LISTEN connection of the waiting-claims hub open (the fixture's, another connection),
    the release's and the completion's wake-ups leave after their commit; once it has closed, a
    release and a completion send none (core.wakeups, "Nobody listening, nothing sent")."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the functions answer alone
    session = register(enrolled_worker())
    revision = make_revision()
    for _ in range(4):
        enqueue(revision)
    worker_wake = wakeups.WORKER_PREFIX + str(session.worker.worker_id)

    def notifies(call) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            call()
        return _notifies(queries.captured_queries)

    complete(start(claim_one(session)))  # this process learns the placement class and the template
    assert len(notifies(lambda: release(claim_one(session)))) == 1
    assert len(notifies(lambda: complete(start(claim_one(session))))) == 1
    wait_for(lambda: worker_wake in heard(), 10, "the completion's wake-up")
    heard.close()  # the only listener goes away
    _no_listeners_left()
    assert notifies(lambda: release(claim_one(session))) == []
    assert notifies(lambda: complete(start(claim_one(session)))) == []


def _no_listeners_left() -> None:
    """Wait until no LISTEN connection of the hub's name is left in this database; on a timeout,
    fail naming the ones left (a hub an earlier test did not stop would be one)."""
    try:
        wait_for(lambda: not _listeners(), 30, "the listeners' backends to end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_listeners()}") from None


def _listeners() -> list:
    """(pid, state, backend start, query) of each LISTEN connection of the hub's name here."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, backend_start, query FROM pg_stat_activity WHERE application_name = %s",
            [wakeups.LISTENER_APPLICATION],
        )
        return cursor.fetchall()


@pytest.mark.postgres
def test_the_database_path_runs_in_autocommit_and_shares_the_retry(monkeypatch):
    monkeypatch.setattr(core.db, "_before_retry", lambda state, service: None)
    seen: list[tuple[bool, bool]] = []

    def first(*, fail: int) -> str | None:
        seen.append((connection.in_atomic_block, connection.get_autocommit()))
        if len(seen) <= fail:  # a real serialization failure from the server
            with connection.cursor() as cursor:
                cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'race' USING ERRCODE = '40001'; END $$")
        return None

    @write_path(database_path=first)
    def body(*, fail: int) -> str:
        return "python" if connection.in_atomic_block else "outside"

    assert body(fail=1) == "python"
    assert seen == [(False, True), (False, True)]  # retried, outside any transaction block
    seen.clear()
    with pytest.raises(core.db.DomainError) as busy:
        body(fail=99)
    assert busy.value.code == "storage_busy"
    assert isinstance(busy.value.__cause__, DatabaseError)
