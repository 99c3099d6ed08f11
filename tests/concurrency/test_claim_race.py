"""Four OS processes, each with its own database connection, race 50 claims each over one
backlog of 200 runs (ADR-0012 §6 "a PostgreSQL contract suite covers multi-replica claim";
docs/leases.md, Claim). Runs on PostgreSQL and on SQLite.

Each process plays a control-plane replica serving six workers (maximum concurrency 3) that all
four processes share, so claims for one worker contend for its row lock and its capacity from
four connections at once. A process finishes (starting → running → complete) one of the leases
it holds when it holds two on the worker it just claimed for, or when a claim finds the worker
full — so capacity frees up and every run gets claimed.
"""

from __future__ import annotations

import multiprocessing
import secrets
import time
import traceback
from collections import Counter, defaultdict

import pytest
from django.db import connections

from actions.leases.activation import lease_running, lease_starting
from actions.leases.claims import OfferRequest, lease_claim
from actions.leases.completion import Completion, lease_complete
from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol.ids import uuid7
from runs.models import Run, RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, register

pytestmark = [pytest.mark.django_db(transaction=True)]

PROCESSES = 4
CLAIMS_EACH = 50
WORKERS = 6
MAX_CONCURRENT = 3


def _replica(index: int, sessions: list[tuple], barrier, results) -> None:
    """One process: claim until it has 50 claims (its own connection, opened after the fork)."""
    outcomes: Counter[str] = Counter()
    held: list[tuple[int, dict]] = []

    def finish(position: int) -> None:
        _, lease = held.pop(position)
        fence = {
            key: lease[key]
            for key in (
                "worker_id",
                "session_id",
                "generation",
                "attempt_id",
                "lease_generation",
                "lease_token",
            )
        }
        as_a_worker_would(lease_starting, **fence, offer_id=lease["offer_id"], lease_version=0)
        as_a_worker_would(
            lease_running,
            **fence,
            offer_id=lease["offer_id"],
            lease_version=0,
            pid=1000 + index,
            pgid=None,
            executor_handle=f"replica-{index}",
        )
        as_a_worker_would(lease_complete, **fence, completion=Completion(1, "succeeded", 0))
        outcomes["finished"] += 1

    def as_a_worker_would(call, **arguments):
        """The call, tried again after ``storage_busy`` (503) as an agent does: four writers on
        one SQLite file on a loaded machine can outwait the busy timeout and the retry budget."""
        for _ in range(30):
            try:
                return call(**arguments)
            except DomainError as exc:
                if exc.code != "storage_busy":
                    raise
                outcomes["storage_busy"] += 1
                time.sleep(0.05)
        return call(**arguments)

    try:
        barrier.wait(timeout=60)
        claims, turn, deadline = 0, index, time.monotonic() + 120
        while claims < CLAIMS_EACH and time.monotonic() < deadline:
            worker_index = turn % len(sessions)
            turn += 1
            worker_id, session_id, generation = sessions[worker_index]
            offer_id, token = uuid7(), secrets.token_urlsafe(32)
            try:
                offers = lease_claim(
                    worker_id=worker_id,
                    session_id=session_id,
                    generation=generation,
                    offers=[OfferRequest(offer_id, token)],
                )
            except DomainError as exc:
                outcomes[exc.code] += 1
                if exc.code == "capacity_exhausted" and held:
                    finish(0)
                continue
            if not offers:
                outcomes["empty"] += 1
                continue
            claims += 1
            lease = offers[0].lease
            held.append(
                (
                    worker_index,
                    {
                        "worker_id": worker_id,
                        "session_id": session_id,
                        "generation": generation,
                        "attempt_id": lease.attempt_id,
                        "lease_generation": lease.lease_generation,
                        "lease_token": token,
                        "offer_id": offer_id,
                    },
                )
            )
            mine = [position for position, (w, _) in enumerate(held) if w == worker_index]
            if len(mine) >= 2:
                finish(mine[0])
        results.put((index, claims, dict(outcomes), None))
    except Exception:  # reported to the parent, which fails the test with the traceback
        results.put((index, 0, dict(outcomes), traceback.format_exc()))
    finally:
        connections.close_all()


def _max_overlap(intervals: list[tuple]) -> int:
    """Most leases of one session active at the same database instant (ends sort before starts)."""
    points = []
    for start, end in intervals:
        points.append((start, 1))
        if end is not None:
            points.append((end, -1))
    active = peak = 0
    for _, step in sorted(points, key=lambda p: (p[0], p[1])):
        active += step
        peak = max(peak, active)
    return peak


def test_four_processes_claim_a_backlog_exactly_once_within_every_workers_capacity(protocol_settings):
    # Every claimer takes the head of the queue: no placement hold for a better-ranked idle worker;
    # and nobody heartbeats here, so session leases must outlast a slow CI machine (the children
    # inherit these settings through the fork).
    protocol_settings(DISPATCH_HOLD_SECONDS=0, SESSION_LEASE_SECONDS=600)
    revision = make_revision()
    runs = [enqueue(revision) for _ in range(PROCESSES * CLAIMS_EACH)]
    sessions = []
    for _ in range(WORKERS):
        session = register(enrolled_worker(), max_concurrent=MAX_CONCURRENT)
        sessions.append((session.worker.worker_id, session.session_id, session.generation))

    connections.close_all()  # each child opens its own connection after the fork
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    children = [
        context.Process(target=_replica, args=(i, sessions, barrier, results)) for i in range(PROCESSES)
    ]
    for child in children:
        child.start()
    reports = [results.get(timeout=180) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0

    failures = [error for *_, error in reports if error]
    assert not failures, failures[0]
    assert sorted(claims for _, claims, _, _ in reports) == [CLAIMS_EACH] * PROCESSES
    outcomes = sum((Counter(o) for _, _, o, _ in reports), Counter())
    # storage_busy: SQLite's writers outwaited the busy timeout (a loaded machine); nothing written
    assert set(outcomes) <= {"finished", "capacity_exhausted", "empty", "storage_busy"}, outcomes
    assert outcomes["capacity_exhausted"] > 0, "the race never met a full worker"

    # every attempt claimed exactly once: one lease each, no attempt left unclaimed
    leases = list(
        RunDispatchLease.objects.values("attempt_id", "session_id", "claimed_at", "ended_at", "state")
    )
    per_attempt = Counter(lease["attempt_id"] for lease in leases)
    attempts = set(RunAttempt.objects.values_list("pk", flat=True))
    assert len(leases) == PROCESSES * CLAIMS_EACH
    assert set(per_attempt) == attempts and set(per_attempt.values()) == {1}
    assert RunAttempt.objects.filter(state="claimed", lease_generation=0).count() == 0
    # no worker ever held more than its maximum concurrency, by the database clock
    by_session = defaultdict(list)
    for lease in leases:
        by_session[lease["session_id"]].append((lease["claimed_at"], lease["ended_at"]))
    peaks = {session: _max_overlap(intervals) for session, intervals in by_session.items()}
    assert max(peaks.values()) <= MAX_CONCURRENT, peaks
    assert outcomes["finished"] == RunDispatchLease.objects.filter(state="completed").count()
    assert Run.objects.filter(pk__in=[r.pk for r in runs], state="succeeded").count() == outcomes["finished"]
