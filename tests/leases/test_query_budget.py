"""Query budgets of the hot worker write paths: claim, the activation ACKs, renew, release,
completion, heartbeat and log append.

A regression that adds round trips fails here, on both stores. PostgreSQL answers a successful
claim, starting and running ACK, renew, release, completion, heartbeat and log append with one
statement each (the functions of migrations leases 0004, 0006, 0007 and 0010,
``actions.sessions.heartbeat`` and migration logs 0003); the release and the completion send one
more after their commit for their wake-ups while some process holds waiting claims
(``core.wakeups``), which is counted apart — at most one, whether or not a hub of an earlier test
still listens — so that the path's own budget stays exact. SQLite (one process) keeps its ORM
paths, whose budgets are today's counts, and wakes its waiters in process. Transaction control
(BEGIN/COMMIT/SAVEPOINT) is not counted: it is not a statement the path chose. The claim budget
is taken once the process has learnt the session's capability digest, the placement class and
the revision's spec template, the completion's once it has read the revision's policy (a process
learns each once; the attempt's revision and number come with its running ACK); the dispatch
hold is 0 so that the claim ranking never needs the fleet (docs/performance.md).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext

from actions.leases import completion
from actions.leases.claims import OfferRequest
from actions.leases.next_claim import lease_complete_and_claim
from actions.sessions.heartbeat import session_heartbeat
from protocol import wire
from tests.helpers import (
    OfferTicket,
    SignedClient,
    enqueue,
    enrolled_worker,
    make_revision,
    register,
    repository_queries,
)
from tests.leases.flows import claim_one, complete, release, renew, running, start, starting
from tests.leases.flows import completion as completion_of
from tests.logs.flows import append_segments

pytestmark = pytest.mark.django_db

#: (PostgreSQL, SQLite) statements per call, its wake-ups (``WAKE_UP``) not counted.
BUDGETS = {
    "claim": (1, 15),
    "release": (1, 14),
    "starting": (1, 11),
    "running": (1, 13),
    "renew": (1, 10),
    "complete": (1, 14),
    "complete_learning": (2, 14),  # PostgreSQL: the running ACK went to another replica
    "complete_and_claim": (1, 29),  # PostgreSQL: both in one call (leases 0017)
    "heartbeat": (1, 2),
    "heartbeat_write": (1, 7),
    "append_first": (2, 12),  # the first chunk of an attempt in this process (PostgreSQL: + its state)
    "append": (1, 11),
}


def budget(name: str) -> int:
    return BUDGETS[name][0 if connection.vendor == "postgresql" else 1]


#: What only the wake-up statement sends (``core.wakeups``, PostgreSQL).
WAKE_UP = "pg_notify("


def counted(action):
    """(result, statements) of ``action`` once its on-commit work ran, less its wake-up statement;
    fails if it sent more than one (PostgreSQL) or any (SQLite)."""
    with CaptureQueriesContext(connection) as queries, TestCase.captureOnCommitCallbacks(execute=True):
        result = action()
    statements = repository_queries(queries)
    wake_ups = [sql for sql in statements if WAKE_UP in sql]
    assert len(wake_ups) <= (1 if connection.vendor == "postgresql" else 0), wake_ups
    return result, [sql for sql in statements if WAKE_UP not in sql]


@pytest.fixture
def warm(protocol_settings):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)
    session = register(enrolled_worker(), max_concurrent=4)
    revision = make_revision()
    for _ in range(5):
        enqueue(revision)
    release(claim_one(session))  # the process learns the digest, the class and the template
    complete(start(claim_one(session)))  # and the revision's policy
    return session


def test_a_claim_and_a_release_stay_within_their_budgets(warm):
    held, statements = counted(lambda: claim_one(warm))
    assert len(statements) <= budget("claim"), statements
    _, statements = counted(lambda: release(held))
    assert len(statements) <= budget("release"), statements


def test_the_activation_acks_stay_within_their_budgets(warm):
    held = claim_one(warm)
    result, statements = counted(lambda: starting(held))
    assert result.status == "starting"
    assert len(statements) <= budget("starting"), statements
    result, statements = counted(lambda: running(held))
    assert result.status == "running"
    assert len(statements) <= budget("running"), statements


def test_a_renewal_and_a_completion_stay_within_their_budgets(warm):
    held = start(claim_one(warm))
    _, statements = counted(lambda: renew(held))
    assert len(statements) <= budget("renew"), statements
    result, statements = counted(lambda: complete(held))
    assert result.outcome == "succeeded"
    assert len(statements) <= budget("complete"), statements


def test_a_completion_carrying_the_next_claim_costs_a_completion_and_a_claim(warm):
    held = start(claim_one(warm))
    ticket = OfferTicket()
    (result, next_claim), statements = counted(
        lambda: lease_complete_and_claim(
            **held.fence(), completion=completion_of(), offers=[OfferRequest(ticket.offer_id, ticket.token)]
        )
    )
    assert result.outcome == "succeeded" and len(next_claim.offers) == 1
    assert len(statements) <= budget("complete_and_claim"), statements


def test_a_completion_whose_running_ack_this_process_did_not_see_stays_within_its_budget(warm):
    """The first call answers the attempt's revision and number (nothing written), the second
    completes (PostgreSQL); the revision's policy is known already."""
    held = start(claim_one(warm))
    completion._attempts.clear()
    result, statements = counted(lambda: complete(held))
    assert result.outcome == "succeeded"
    assert len(statements) <= budget("complete_learning"), statements


def heartbeat(session, version: int, slots: int):
    return session_heartbeat(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=version,
        available_slots=slots,
    )


def test_an_unchanged_heartbeat_and_a_slot_change_stay_within_their_budget():
    session = register(enrolled_worker(), max_concurrent=2)
    view, statements = counted(lambda: heartbeat(session, 0, 2))
    assert view.session.version == 0
    assert len(statements) <= budget("heartbeat"), statements
    view, statements = counted(lambda: heartbeat(session, 0, 1))
    assert view.session.version == 1
    assert len(statements) <= budget("heartbeat_write"), statements


def test_a_log_append_stays_within_its_budget(warm):
    """A chunk of two segments: the first of an attempt (the process learns the log's state and
    the revision's secrets), then the usual one (PostgreSQL: one call of ``ql_log_append``)."""
    held = start(claim_one(warm))
    first, statements = counted(
        lambda: append_segments(held, 1, [("stdout", 0, b"a\n"), ("stderr", 0, b"b\n")])
    )
    assert first.status == "stored"
    assert len(statements) <= budget("append_first"), statements
    later, statements = counted(
        lambda: append_segments(held, 2, [("stdout", 2, b"c\n"), ("stderr", 2, b"d\n")])
    )
    assert (later.status, later.stored_bytes) == ("stored", 8)
    assert len(statements) <= budget("append"), statements


def test_a_warm_signed_heartbeat_over_http_sends_only_its_own_statement(client):
    """The whole signed request — authentication, the principal binding, the view — once this
    process knows the credential: the heartbeat's statement is all it sends (no per-request
    connection check, no credential or session-owner read; the replay store's nonce aside)."""
    worker = enrolled_worker()
    session = register(worker, max_concurrent=2)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    warm = api.post(wire.SESSION_HEARTBEAT, body)
    assert warm.status_code == 200, warm.json()
    with CaptureQueriesContext(connection) as queries:
        answer = api.post(wire.SESSION_HEARTBEAT, body)
    assert answer.status_code == 200, answer.json()
    statements = repository_queries(queries)
    assert len(statements) <= budget("heartbeat"), statements
