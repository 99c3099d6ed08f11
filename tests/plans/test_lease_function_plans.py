"""The lease functions plan their statements once per connection (migration ``leases/0012``,
docs/performance.md "The functions' statements planned once"): the setting is on every one of
them, so a later ``CREATE OR REPLACE FUNCTION`` that drops them fails here, and a connection that
planned its claim while the lease table was nearly empty still reads leases by index once the
table has grown. That the answers are unchanged is the PostgreSQL leg's lease, race and contract
tests, which run with them. (Not under tests/leases, whose tests run once per claim path: these
set the one they need.)"""

from __future__ import annotations

import importlib
import re

import pytest
from django.db import connection

from actions.sessions.heartbeat import session_heartbeat
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, release, renew, start
from tests.logs.flows import append

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

_MIGRATION = importlib.import_module("leases.migrations.0012_lease_functions_plan_once")
FUNCTIONS = _MIGRATION.FUNCTIONS
SETTINGS = {
    **_MIGRATION.SETTINGS,
    **importlib.import_module("leases.migrations.0014_lease_functions_read_by_key").SETTINGS,
}


def test_every_lease_function_carries_the_plan_once_settings():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, coalesce(p.proconfig, '{}') FROM pg_proc p WHERE p.proname = ANY (%s)",
            [list(FUNCTIONS)],
        )
        settings = dict(cursor.fetchall())
    assert sorted(settings) == sorted(FUNCTIONS)
    for name, config in settings.items():
        for setting, value in SETTINGS.items():
            assert f"{setting}={value}" in config, (name, config)


#: Copies of one released lease under new keys (``n`` of them), as a long-used table holds.
_GROW = """
INSERT INTO leases_rundispatchlease
SELECT (jsonb_populate_record(NULL::leases_rundispatchlease, to_jsonb(l) || jsonb_build_object(
        'id', gen_random_uuid(), 'offer_id', gen_random_uuid(), 'lease_generation', 1000 + g,
        'token_digest', md5(g::text) || md5(l.id::text)))).*
  FROM leases_rundispatchlease l, generate_series(1, %s) AS g
 WHERE l.id = (SELECT id FROM leases_rundispatchlease WHERE state = 'released' LIMIT 1)
"""


def _plans_of(act, *, analyze: bool = False) -> list[str]:
    """The plans of the statements the server functions ``act()`` calls run (auto_explain), with
    the buffers each read when ``analyze``."""
    raw = connection.connection
    notices: list[str] = []

    def heard(diagnostic) -> None:
        notices.append(diagnostic.message_primary or "")

    raw.add_notice_handler(heard)
    with connection.cursor() as cursor:
        cursor.execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
            " SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = 'notice';"
            f" SET auto_explain.log_analyze = {'on' if analyze else 'off'};"
            " SET auto_explain.log_buffers = on; SET auto_explain.log_timing = off"
        )
    try:
        act()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET auto_explain.log_min_duration = -1")
        raw.remove_notice_handler(heard)
    return notices


def test_a_claim_planned_on_a_nearly_empty_lease_table_reads_leases_by_index_once_it_has_grown(
    protocol_settings,
):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    session = register(enrolled_worker())
    revision = make_revision()
    for _ in range(3):
        enqueue(revision)
    held = claim_one(session)  # this connection plans the claim's statements: one lease row
    release(held)
    release(claim_one(session))  # (the second call runs on the plans of the first)
    with connection.cursor() as cursor:
        cursor.execute(_GROW, [20_000])
    plans = _plans_of(lambda: release(claim_one(session)))
    assert any("ql_lease_claim" in plan for plan in plans), plans
    scans = [plan for plan in plans if "Seq Scan on leases_rundispatchlease" in plan]
    assert scans == [], scans[0]


#: Copies of one queued run and its waiting attempt under new keys (``n`` of them): a backlog that
#: grew after the claim was planned. Foreign keys are checked at commit, which a test never reaches.
_GROW_QUEUE = """
WITH copies AS (
    SELECT gen_random_uuid() AS run_id, gen_random_uuid() AS attempt_id FROM generate_series(1, %(n)s)
), runs AS (
    INSERT INTO runs_run
    SELECT (jsonb_populate_record(NULL::runs_run, to_jsonb(r) || jsonb_build_object('id', c.run_id))).*
      FROM runs_run r, copies c WHERE r.id = %(run)s
)
INSERT INTO runs_runattempt
SELECT (jsonb_populate_record(NULL::runs_runattempt, to_jsonb(a)
        || jsonb_build_object('id', c.attempt_id, 'run_id', c.run_id))).*
  FROM runs_runattempt a, copies c WHERE a.run_id = %(run)s
"""


def _buffers(plans: list[str]) -> list[tuple[int, str]]:
    """(shared buffers read, text) of each logged statement that reports its buffers, calls included."""
    out = []
    for plan in plans:
        text = plan.split("Query Text:", 1)[-1].strip()
        top = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
        if top:
            out.append((int(top.group(1)) + int(top.group(2) or 0), text))
    return out


def _statement_buffers(plans: list[str]) -> list[tuple[int, str]]:
    """(shared buffers read, text on one line) of each statement the functions ran: the calls
    themselves (the sum of what their statements read) left out."""
    return [
        (read, " ".join(text.split()))
        for read, text in _buffers(plans)
        if not text.startswith(("SELECT ql_lease_", "SELECT ql_log_"))
    ]


def _most_buffers(plans: list[str]) -> tuple[int, str]:
    """The most shared buffers one statement inside the functions read, and its first 80 characters."""
    return max([(0, ""), *((read, text[:80]) for read, text in _statement_buffers(plans))])


def test_a_claim_planned_on_a_short_queue_reads_what_a_fresh_plan_reads_once_the_queue_has_grown(
    protocol_settings,
):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    session = register(enrolled_worker())
    revision = make_revision()
    runs = [enqueue(revision) for _ in range(3)]
    release(claim_one(session))  # this connection plans the claim's statements: three runs
    release(claim_one(session))
    with connection.cursor() as cursor:
        cursor.execute(_GROW_QUEUE, {"n": 20_000, "run": runs[-1].pk})
    kept = _most_buffers(_plans_of(lambda: release(claim_one(session)), analyze=True))
    with connection.cursor() as cursor:
        cursor.execute("DISCARD PLANS")  # the same rows, planned on the grown queue
    fresh = _most_buffers(_plans_of(lambda: release(claim_one(session)), analyze=True))
    assert fresh[0] > 0, fresh
    # Both read the same rows (dead ones other tests left included); a plan kept from the short
    # queue read every run of the backlog for each claim (19,620 buffers against 53).
    assert kept[0] <= 2 * fresh[0] + 50, (kept, fresh)


#: Copies of one active lease under new keys for other sessions (``n`` of them): a fleet's worth of
#: running attempts that arrived after a heartbeat was planned. Foreign keys are checked at commit,
#: which a test never reaches.
_GROW_ACTIVE = """
INSERT INTO leases_rundispatchlease
SELECT (jsonb_populate_record(NULL::leases_rundispatchlease, to_jsonb(l) || jsonb_build_object(
        'id', gen_random_uuid(), 'offer_id', gen_random_uuid(), 'attempt_id', gen_random_uuid(),
        'session_id', gen_random_uuid(), 'token_digest', md5(g::text) || md5(l.id::text)))).*
  FROM leases_rundispatchlease l, generate_series(1, %s) AS g
 WHERE l.id = (SELECT id FROM leases_rundispatchlease WHERE state = 'leased' LIMIT 1)
"""


def test_a_heartbeat_planned_on_few_active_leases_reads_its_own_once_the_fleet_has_grown():
    """The heartbeat's statement (actions.sessions.heartbeat) is prepared once per connection, so
    the plan it made on a near-empty lease table is the one it keeps: its cancel list must read
    the session's own active leases by the session's index, not every active lease."""
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = claim_one(session)  # one active lease: the cancel list has a row to look at
    beat = {
        "worker_id": session.worker.worker_id,
        "session_id": session.session_id,
        "generation": session.generation,
        "available_slots": 1,
    }
    version = session.version
    for _ in range(8):  # past the custom plans: the connection keeps its generic plan from here
        version = session_heartbeat(**beat, expected_version=version).session.version
    with connection.cursor() as cursor:
        cursor.execute(_GROW_ACTIVE, [20_000])

    def heartbeat_once() -> None:
        session_heartbeat(**beat, expected_version=version)

    try:
        kept = _most_statement_buffers(_plans_of(heartbeat_once, analyze=True), "WITH cur AS")
        with connection.cursor() as cursor:
            cursor.execute("DISCARD PLANS")  # the same rows, planned on the grown table
        fresh = _most_statement_buffers(_plans_of(heartbeat_once, analyze=True), "WITH cur AS")
    finally:  # the copies name no real attempt or session: gone before the test's FK check
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM leases_rundispatchlease WHERE attempt_id <> %s", [held.attempt_id])
    assert held.lease_generation == 1
    assert fresh > 0, fresh
    # A plan kept from one active lease walked the whole partial index of active leases in
    # attempt order for every heartbeat (the ORDER BY's index) and filtered it by session.
    assert kept <= 2 * fresh + 20, (kept, fresh)


def _most_statement_buffers(plans: list[str], opening: str) -> int:
    """The shared buffers read by the logged statement whose text starts with ``opening``."""
    read = [buffers for buffers, text in _buffers(plans) if text.startswith(opening)]
    assert read, plans
    return max(read)


@pytest.mark.django_db(transaction=True)  # each claim and release commits, as in production
def test_a_claims_first_read_does_not_grow_with_the_leases_its_worker_and_session_ended(protocol_settings):
    """The claim's read after the worker lock (capacity and replay, leases ``0015``) stays a few
    buffers however many leases the session ended since the last ``VACUUM`` and however long its
    worker's lease history: an index-only count visited every ended lease's row on every claim,
    and a replay check planned on a near-empty table read every lease of the worker."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    session = register(enrolled_worker())
    enqueue(make_revision())
    release(claim_one(session))  # this connection plans the claim's statements: one lease row
    release(claim_one(session))

    def claim_and_release() -> None:
        release(claim_one(session))

    first = _most_statement_buffers(_plans_of(claim_and_release, analyze=True), "SELECT se.generation")
    for _ in range(60):  # ended leases of this session, each still an entry of its active index
        claim_and_release()
    with connection.cursor() as cursor:
        cursor.execute(_GROW, [5_000])  # and a long history of the worker (released leases)
    claim_and_release()  # the first claim past the ended entries may visit each once
    later = _most_statement_buffers(_plans_of(claim_and_release, analyze=True), "SELECT se.generation")
    assert first > 0, first
    assert later <= first + 10, (first, later)


#: Copies of a worker's session that ended (``n`` of them, generations 1000 on): a worker restarted
#: that often (a crash loop, a router rebooting nightly for years) has as many session rows.
_GROW_SESSIONS = """
INSERT INTO workers_workersession
SELECT (jsonb_populate_record(NULL::workers_workersession, to_jsonb(s) || jsonb_build_object(
        'id', gen_random_uuid(), 'generation', 1000 + g, 'state', 'offline'))).*
  FROM workers_workersession s, generate_series(1, %s) AS g
 WHERE s.id = %s
"""


def test_every_worker_call_reads_by_key_however_many_sessions_and_leases_its_worker_had(protocol_settings):
    """The session and lease lookups planned on small tables must not read the worker's other
    sessions or leases once it has many (leases ``0016``, logs ``0005``): claim, ACKs, renewal,
    log append, completion, release and heartbeat, each statement of each. The live session is
    the worker's newest row, as after any restart: behind every one it ended (1,840 buffers a
    call after 20,000 restarts, against 5; 5,000 here)."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    worker = enrolled_worker()
    live = [register(worker)]
    revision = make_revision()
    for _ in range(6):
        enqueue(revision)

    def every_call() -> None:
        session = live[-1]
        release(claim_one(session))
        held = start(claim_one(session))
        renew(held)
        append(held, 1, b"out\n")
        complete(held)
        session.version = session_heartbeat(
            worker_id=worker.worker_id,
            session_id=session.session_id,
            generation=session.generation,
            available_slots=2,
            expected_version=session.version,
        ).session.version

    for _ in range(2):  # plans made on a worker with one session and a few leases
        every_call()
    with connection.cursor() as cursor:
        cursor.execute(_GROW_SESSIONS, [5_000, live[-1].session_id])
        cursor.execute(_GROW, [5_000])
    live.append(register(worker))  # the worker restarts: its new session is its newest row
    plans = _plans_of(every_call, analyze=True)
    assert any("ql_log_append" in plan for plan in plans), "the log append ran its function"
    # The statements that read the session (with the claim's capacity and replay, the release's
    # lease): the queue's reads also meet the dead rows other tests leave, and have their own tests.
    reads = [(read, text) for read, text in _statement_buffers(plans) if "workers_workersession" in text]
    assert len(reads) >= 6, reads  # two claims, a release and a renewal, two ACKs, completion, append
    assert max(reads)[0] <= 100, sorted(reads, reverse=True)[:3]
    # Whatever the statistics: the session is found by its key, never among its worker's rows.
    session_reads = [plan for plan in plans if re.search(r"FROM workers_workersession( se)? WHERE", plan)]
    assert len(session_reads) >= 6, session_reads
    for plan in session_reads:
        assert "workers_workersession_pkey" in plan and "worker_id_" not in plan, plan
