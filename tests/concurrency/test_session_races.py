"""Session races with real separate connections, on SQLite and on PostgreSQL (ADR-0012 gates).

Each test runs 100 rounds (the fifty-worker one 20: 1,000 registrations). In a round the main
thread prepares the world, releases every actor thread at once (``threading.Barrier``), waits for
them, and checks exact outcomes and exact row states. Every actor thread keeps its own Django
connection for all rounds and closes it at the end. Rounds never sleep. The gates:

* two registrations racing to replace the same worker → generation strictly monotonic, exactly
  one current session, every older session refused afterwards;
* a heartbeat racing a replacement → it lands before the replacement or is fenced, never revives;
* drain racing offline (and a claim) → capacity is zero before offline commits, and no run is
  claimed after the drain or the offline committed;
* a drain racing a heartbeat that moves the version → the loser is told the current version;
* 50 different workers registering at once → all succeed, no deadlock, no 500.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from actions.enrollment import worker_create
from actions.leases.claims import OfferRequest, lease_claim
from actions.sessions import registration
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.registration import session_register
from actions.sessions.shutdown import session_drain, session_offline
from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol.ids import uuid7
from runs.selectors import dispatch_queue_page
from tests.helpers import OfferTicket, enqueue, make_revision, snapshot
from workers.models import WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("session-races")]

ROUNDS = 100
FIFTY_ROUNDS = 20
BARRIER_TIMEOUT = 60


def run_rounds(
    actors: list[Callable[[int], Any]],
    *,
    rounds: int = ROUNDS,
    prepare: Callable[[int], None] = lambda r: None,
    check: Callable[[int, list[tuple[str, Any]]], None],
) -> None:
    """Run ``actors`` (each in its own thread and connection) against each other ``rounds`` times.

    Each actor's outcome is ``("ok", value)``, ``("refused", code)`` for a ``DomainError`` or
    ``("error", repr)`` for anything else — which fails the round (a 500 in production).
    """
    start = threading.Barrier(len(actors) + 1, timeout=BARRIER_TIMEOUT)
    done = threading.Barrier(len(actors) + 1, timeout=BARRIER_TIMEOUT)
    outcomes: list[list[tuple[str, Any]]] = [[("missing", None)] * rounds for _ in actors]

    def work(index: int, actor: Callable[[int], Any]) -> None:
        try:
            for round_no in range(rounds):
                start.wait()
                try:
                    outcomes[index][round_no] = ("ok", actor(round_no))
                except DomainError as exc:
                    outcomes[index][round_no] = ("refused", exc.code)
                except Exception as exc:  # noqa: BLE001 - recorded and asserted on by the main thread
                    outcomes[index][round_no] = ("error", repr(exc))
                done.wait()
        except threading.BrokenBarrierError:
            pass  # the main thread gave up on a failed check
        finally:
            connection.close()

    threads = [
        threading.Thread(target=work, args=(i, actor), name=f"actor-{i}") for i, actor in enumerate(actors)
    ]
    for thread in threads:
        thread.start()
    try:
        for round_no in range(rounds):
            prepare(round_no)
            start.wait()
            done.wait()
            results = [outcomes[i][round_no] for i in range(len(actors))]
            errors = [result for result in results if result[0] != "ok" and result[0] != "refused"]
            assert not errors, f"round {round_no}: {errors}"
            check(round_no, results)
    finally:
        start.abort()
        done.abort()
        for thread in threads:
            thread.join(BARRIER_TIMEOUT)


def new_worker(name: str):
    return worker_create(name=name)


SNAPSHOT = snapshot()


def register(worker_id, session_id=None) -> tuple:
    view = session_register(
        worker_id=worker_id,
        session_id=session_id or uuid7(),
        capabilities=SNAPSHOT,
        max_concurrent_runs=2,
        available_slots=2,
        software_version="race/1",
        protocol_version=1,
    )
    return view.session.pk, view.session.generation, view.session.version, view.replayed


def heartbeat(worker_id, session_id, generation, version, slots=2):
    view = session_heartbeat(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=version,
        available_slots=slots,
    )
    return view.session.version


def live_sessions(worker_id) -> list[WorkerSession]:
    return list(WorkerSession.objects.filter(worker_id=worker_id, state__in=["online", "draining"]))


def assert_refused(worker_id, session: WorkerSession, code: str = "session_superseded") -> None:
    with pytest.raises(DomainError) as refused:
        heartbeat(worker_id, session.pk, session.generation, session.version)
    assert refused.value.code == code


@pytest.fixture(autouse=True)
def _no_takeover_limit(protocol_settings):
    """These tests replace sessions far faster than the storm limit allows on purpose."""
    protocol_settings(TAKEOVERS_PER_MINUTE=10_000)


def test_two_registrations_racing_to_replace_the_same_worker():
    worker = new_worker("race-replace")
    register(worker.pk)
    ids: dict[int, tuple] = {}

    def prepare(round_no: int) -> None:
        first = uuid7()
        # every fourth round both registrations carry the same new id: one creates, one replays
        ids[round_no] = (first, first if round_no % 4 == 3 else uuid7())

    def check(round_no: int, results) -> None:
        previous_top = ids.setdefault("top", (1, 0))
        (_, a), (_, b) = results
        same_id = ids[round_no][0] == ids[round_no][1]
        if same_id:
            assert a[:3] == b[:3] and sorted([a[3], b[3]]) == [False, True], results  # one replay
            assert a[1] == previous_top[0] + 1
        else:
            assert not a[3] and not b[3]
            assert sorted([a[1], b[1]]) == [previous_top[0] + 1, previous_top[0] + 2], results
        sessions = list(WorkerSession.objects.filter(worker_id=worker.pk).order_by("generation"))
        generations = [s.generation for s in sessions]
        versions = [s.version for s in sessions]
        assert generations == list(range(1, len(sessions) + 1))
        assert all(x < y for x, y in zip(versions, versions[1:], strict=False)), versions
        current = live_sessions(worker.pk)
        assert [s.pk for s in current] == [sessions[-1].pk]
        assert current[0].generation > previous_top[0] and current[0].version > previous_top[1]
        for older in sessions[-3:-1]:  # the sessions this round fenced
            assert older.state == "fenced" and older.available_slots == 0
            assert_refused(worker.pk, older)
        ids["top"] = (current[0].generation, current[0].version)

    run_rounds(
        [lambda r: register(worker.pk, ids[r][0]), lambda r: register(worker.pk, ids[r][1])],
        prepare=prepare,
        check=check,
    )
    older = WorkerSession.objects.filter(worker_id=worker.pk).exclude(state="online")
    assert older.count() == WorkerSession.objects.filter(worker_id=worker.pk).count() - 1
    for session in older:
        assert_refused(worker.pk, session)
    assert Event.objects.filter(kind="session.registered", worker_id=worker.pk).count() == older.count() + 1


def test_heartbeat_racing_replacement_lands_before_or_is_fenced_never_revives():
    worker = new_worker("race-heartbeat")
    pk, generation, version, _ = register(worker.pk)
    state = {"current": (pk, generation, version), "slots": 2}

    def prepare(round_no: int) -> None:
        pk, generation, version = state["current"]
        # two in three heartbeats must write: a slot change, or a lease past half its life
        state["slots"] = 1 if round_no % 3 == 0 else 2
        if round_no % 3 == 1:
            session = WorkerSession.objects.get(pk=pk)
            WorkerSession.objects.filter(pk=pk).update(
                lease_expires_at=session.lease_expires_at
                - (session.lease_expires_at - session.registered_at) * 0.6
            )
        state["before"] = WorkerSession.objects.get(pk=pk)

    def beat(round_no: int):
        pk, generation, version = state["current"]
        return heartbeat(worker.pk, pk, generation, version, slots=state["slots"])

    def check(round_no: int, results) -> None:
        (_, registered), (verdict, beat_result) = results
        assert results[0][0] == "ok", results
        before = state["before"]
        old = WorkerSession.objects.get(pk=before.pk)
        assert (old.state, old.end_reason, old.available_slots) == ("fenced", "superseded", 0)
        bumped = state["slots"] != before.available_slots
        if verdict == "ok":  # it landed first: its write is inside the fenced row's history
            assert beat_result == before.version + (1 if bumped else 0)
            assert old.version == beat_result + 1
        else:
            assert beat_result == "session_superseded", results
            assert old.version == before.version + 1
        assert [s.pk for s in live_sessions(worker.pk)] == [registered[0]]
        assert_refused(worker.pk, old)
        state["current"] = registered[:3]

    run_rounds([lambda r: register(worker.pk), beat], prepare=prepare, check=check)


def test_drain_racing_offline_zeroes_capacity_before_offline_commits():
    worker = new_worker("race-drain")
    revision = make_revision(command="echo race")
    state: dict[str, Any] = {}

    def prepare(round_no: int) -> None:
        if not dispatch_queue_page(now=db_now()):  # one claimable attempt waits in every round
            enqueue(revision)
        pk, generation, version, _ = register(worker.pk)  # replaces last round's session
        state.update(
            session=(pk, generation, version),
            mark=Event.objects.order_by("-pk").values_list("pk", flat=True).first(),
        )

    def drain(round_no: int):
        pk, generation, version = state["session"]
        return session_drain(
            worker_id=worker.pk, session_id=pk, generation=generation, expected_version=version
        ).session.version

    def offline(round_no: int):
        pk, generation, version = state["session"]
        try:
            return session_offline(
                worker_id=worker.pk, session_id=pk, generation=generation, expected_version=version
            ).session.version
        except DomainError as exc:  # the agent adopts the current version once and asks again
            if exc.code != "session_version_conflict":
                raise
            return session_offline(
                worker_id=worker.pk,
                session_id=pk,
                generation=generation,
                expected_version=exc.details["currentVersion"],
            ).session.version

    def claim(round_no: int):
        pk, generation, _ = state["session"]
        ticket = OfferTicket()
        return len(
            lease_claim(
                worker_id=worker.pk,
                session_id=pk,
                generation=generation,
                offers=[OfferRequest(ticket.offer_id, ticket.token)],
            )
        )

    def check(round_no: int, results) -> None:
        (drained, _), (went_offline, offline_result), (claimed, claim_result) = results
        pk = state["session"][0]
        session = WorkerSession.objects.get(pk=pk)
        assert drained == "ok" or results[0][1] == "session_offline", results
        assert went_offline == "ok" or offline_result == "session_has_active_leases", results
        assert claimed == "ok" or claim_result in ("session_draining", "session_offline"), results
        events = {e.kind: e.pk for e in Event.objects.filter(pk__gt=state["mark"], session_id=pk)}
        leases = list(RunDispatchLease.objects.filter(session_id=pk))
        claimed_events = list(
            Event.objects.filter(pk__gt=state["mark"], kind="lease.claimed", session_id=pk).values_list(
                "pk", flat=True
            )
        )
        # capacity is zero once the drain or the offline committed, and no claim came after
        assert session.available_slots == 0
        for stop in ("session.drained", "session.offline"):
            if stop in events:
                assert all(claim_pk < events[stop] for claim_pk in claimed_events), (events, claimed_events)
        if went_offline == "ok":
            assert session.state == "offline"
            assert not [lease for lease in leases if lease.state == "leased"]
            if drained == "ok":
                assert events["session.drained"] < events["session.offline"]
        else:
            assert (
                session.state == "draining"
                and len([lease for lease in leases if lease.state == "leased"]) == 1
            )
        assert (claimed == "ok" and claim_result == 1) == bool(leases)

    run_rounds([drain, offline, claim], prepare=prepare, check=check)


def test_fifty_workers_registering_at_once_all_succeed():
    workers = [new_worker(f"race-fifty-{i:02d}") for i in range(50)]

    def registers(worker):
        return lambda round_no: register(worker.pk)

    def check(round_no: int, results) -> None:
        assert [verdict for verdict, _ in results] == ["ok"] * 50, [r for r in results if r[0] != "ok"]
        assert {result[1] for _, result in results} == {round_no + 1}  # every worker's next generation
        assert WorkerSession.objects.filter(state="online").count() == 50

    run_rounds([registers(worker) for worker in workers], rounds=FIFTY_ROUNDS, check=check)
    assert WorkerSession.objects.count() == 50 * FIFTY_ROUNDS
    assert WorkerSession.objects.filter(state="fenced").count() == 50 * (FIFTY_ROUNDS - 1)


@pytest.mark.postgres
def test_pg_same_session_id_inserted_concurrently_by_two_workers_is_a_conflict_not_a_500(monkeypatch):
    """The unique-key race injected between the existence check and the insert (ADR-0012 §6).

    The owner inserts session id X and holds its transaction open; the intruder (another worker,
    so another worker lock) checks that X does not exist, inserts it and waits on the owner's
    uncommitted key; the owner commits; the intruder's insert fails with a unique violation and
    the re-run of its transaction answers ``session_replay_conflict`` — never a 500. (On SQLite
    the IMMEDIATE transactions serialise the two before the check, so this cannot happen there.)
    """

    owner, intruder = new_worker("race-owner"), new_worker("race-intruder")
    owner_inserted, intruder_inserting = threading.Event(), threading.Event()
    real_create = WorkerSession.objects.create

    def create(**fields):
        if threading.current_thread().name == "actor-1":
            intruder_inserting.set()  # checked, and now inserting: this blocks on the owner's key
        return real_create(**fields)

    real_record = registration.record

    def record(kind, **kwargs):
        written = real_record(kind, **kwargs)
        if threading.current_thread().name == "actor-0" and kind == "session.registered":
            owner_inserted.set()
            assert intruder_inserting.wait(BARRIER_TIMEOUT)  # commit only once the intruder looked
        return written

    monkeypatch.setattr(registration.WorkerSession.objects, "create", create)
    monkeypatch.setattr(registration, "record", record)
    ids: dict[int, Any] = {}

    def prepare(round_no: int) -> None:
        owner_inserted.clear()
        intruder_inserting.clear()
        ids[round_no] = uuid7()

    def intruder_registers(round_no: int):
        assert owner_inserted.wait(BARRIER_TIMEOUT)
        return register(intruder.pk, ids[round_no])

    def check(round_no: int, results) -> None:
        assert results[0][0] == "ok", results
        assert results[1] == ("refused", "session_replay_conflict"), results
        assert WorkerSession.objects.get(pk=ids[round_no]).worker_id == owner.pk

    run_rounds(
        [lambda r: register(owner.pk, ids[r]), intruder_registers], rounds=10, prepare=prepare, check=check
    )
    assert not WorkerSession.objects.filter(worker_id=intruder.pk).exists()


def test_a_drain_racing_a_heartbeat_that_moves_the_version_is_told_the_current_version():
    """The agent's drain and its own heartbeat (which changes the slots, so version + 1) race. On
    PostgreSQL the heartbeat is one statement without the worker lock, so it can land between the
    drain's fence read and its write. Whichever loses is refused ``session_version_conflict`` with
    ``details.currentVersion`` — the version the agent adopts for its one retry, which then
    succeeds — never a conflict it cannot act on (the agent would stop with "drain failed")."""
    worker = new_worker("race-drain-heartbeat")
    state: dict[str, Any] = {}

    def prepare(round_no: int) -> None:
        state["session"] = register(worker.pk)[:3]

    def retried(call: Callable[[int], Any]) -> Any:
        try:
            return ("first", call(state["session"][2]))
        except DomainError as exc:
            if exc.code != "session_version_conflict":
                raise
            assert exc.details and "currentVersion" in exc.details, exc.message
            return ("retried", call(exc.details["currentVersion"]))

    def drain(round_no: int):
        pk, generation, _ = state["session"]
        return retried(
            lambda version: (
                session_drain(
                    worker_id=worker.pk, session_id=pk, generation=generation, expected_version=version
                ).session.state
            )
        )

    def beat(round_no: int):
        pk, generation, _ = state["session"]
        return retried(lambda version: heartbeat(worker.pk, pk, generation, version, slots=1))

    def check(round_no: int, results) -> None:
        assert all(verdict == "ok" for verdict, _ in results), results
        (_, (_, drained)), _ = results
        assert drained == "draining"
        session = WorkerSession.objects.get(pk=state["session"][0])
        assert (session.state, session.available_slots) == ("draining", 0)

    run_rounds([drain, beat], prepare=prepare, check=check)
