"""Claims (worker pull): the queue order, capacity, replay and conflicts, takeover (ADR-0012 §3,
docs/placement.md §5), through the service."""

from __future__ import annotations

import pytest

from actions.leases.claims import OfferRequest, lease_claim
from actions.runs import run_cancel
from actions.workers import worker_drain
from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol.ids import uuid7
from runs.models import Run, RunAttempt
from runs.selectors import dispatch_queue_page
from tests.helpers import OfferTicket, enqueue, enrolled_worker, make_revision, register, snapshot
from tests.leases.flows import claim, claim_one, expire_lease, lease_rows, starting

pytestmark = pytest.mark.django_db


def offer(ticket: OfferTicket) -> OfferRequest:
    return OfferRequest(ticket.offer_id, ticket.token)


def claim_raw(session, *tickets: OfferTicket):
    return lease_claim(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        offers=[offer(t) for t in tickets],
    )


def test_a_claim_writes_the_lease_the_projection_and_the_dispatching_run():
    session = register(enrolled_worker())
    run = enqueue(make_revision(command="echo hi", timeout_seconds=9))
    ticket = OfferTicket()
    [answer] = claim_raw(session, ticket)
    assert answer.status == "claimed"
    lease = RunDispatchLease.objects.get()
    assert (lease.state, lease.lease_generation, lease.version, lease.session_generation) == (
        "leased",
        1,
        0,
        1,
    )
    assert lease.offer_id == ticket.offer_id and ticket.token not in lease.token_digest
    assert (lease.expires_at - lease.claimed_at).total_seconds() == pytest.approx(30)  # dispatch timeout
    attempt = RunAttempt.objects.get(run=run)
    assert attempt.state == "claimed"  # a claim is not a start
    assert (attempt.lease_generation, attempt.lease_expires_at, attempt.session_id) == (
        1,
        lease.expires_at,
        session.session_id,
    )
    assert Run.objects.get(pk=run.pk).state == "dispatching"
    spec = answer.execution
    assert (spec["command"], spec["timeoutSeconds"], spec["attemptNumber"], spec["runId"]) == (
        "echo hi",
        9,
        1,
        str(run.pk),
    )
    assert answer.renew_interval_seconds == 15
    assert [k for k in Event.objects.filter(run_id=run.pk).values_list("kind", flat=True).order_by("id")][
        -2:
    ] == ["run.dispatching", "lease.claimed"]


def test_claims_follow_priority_then_fifo_then_id():
    session = register(enrolled_worker(), max_concurrent=4)
    revision = make_revision()
    low, first, second, high = (
        enqueue(revision, -5),
        enqueue(revision),
        enqueue(revision),
        enqueue(revision, 9),
    )
    order = [Run.objects.get(pk=RunAttempt.objects.get(pk=h.attempt_id).run_id).pk for h in claim(session, 4)]
    assert order == [high.pk, first.pk, second.pk, low.pk]


def test_capacity_is_min_of_max_concurrency_and_available_slots_minus_active_leases():
    session = register(enrolled_worker(), max_concurrent=3, slots=2)
    revision = make_revision()
    for _ in range(4):
        enqueue(revision)
    assert len(claim(session, 3)) == 2
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        claim(session)
    assert refused.value.code == "capacity_exhausted" and refused.value.details == {"activeLeases": 2}
    assert lease_rows() == before


def test_a_run_whose_placement_the_worker_misses_is_never_claimed():
    session = register(enrolled_worker(), snap=snapshot(arch="aarch64"))
    enqueue(make_revision(placement={"required": {"arch": ["x86_64"]}}))
    assert claim(session) == []
    assert not RunDispatchLease.objects.exists()


def test_a_replayed_offer_rebuilds_the_same_answer_and_writes_nothing():
    session = register(enrolled_worker())
    enqueue(make_revision())
    ticket = OfferTicket()
    [first] = claim_raw(session, ticket)
    before = lease_rows()
    [again] = claim_raw(session, ticket)
    assert again.status == "idempotent" and again.execution == first.execution
    assert (again.lease.pk, again.lease.version, again.lease.expires_at) == (
        first.lease.pk,
        first.lease.version,
        first.lease.expires_at,
    )
    assert lease_rows() == before


def test_a_replay_with_another_token_or_from_another_session_conflicts():
    worker = enrolled_worker()
    session = register(worker)
    enqueue(make_revision())
    ticket = OfferTicket()
    claim_raw(session, ticket)
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        claim_raw(session, OfferTicket(offer_id=ticket.offer_id))
    assert (refused.value.code, refused.value.field) == ("lease_offer_conflict", "offers[0].offerId")
    assert lease_rows() == before
    newer = register(worker)  # the old session's lease is settled (back to the queue)
    with pytest.raises(DomainError) as refused:
        claim_raw(newer, ticket)
    assert refused.value.code == "lease_offer_conflict"


def test_a_reused_lease_token_is_refused():
    session = register(enrolled_worker(), max_concurrent=2)
    revision = make_revision()
    enqueue(revision), enqueue(revision)
    ticket = OfferTicket()
    claim_raw(session, ticket)
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        claim_raw(session, OfferTicket(token=ticket.token))
    assert (refused.value.code, refused.value.field) == ("lease_offer_conflict", "offers[0].leaseToken")
    assert lease_rows() == before


def test_two_workers_may_present_the_same_token_without_colliding():
    """Digests are bound to the worker: another worker's identical token is a different digest."""
    one, two = register(enrolled_worker()), register(enrolled_worker())
    revision = make_revision()
    enqueue(revision), enqueue(revision)
    token = OfferTicket().token
    assert len(claim_raw(one, OfferTicket(token=token))) == 1
    assert len(claim_raw(two, OfferTicket(token=token))) == 1
    assert RunDispatchLease.objects.values("token_digest").distinct().count() == 2


@pytest.mark.parametrize(
    ("tickets", "field"),
    [
        (lambda t: [t, OfferTicket(offer_id=t.offer_id)], "offers[1].offerId"),
        (lambda t: [t, OfferTicket(token=t.token)], "offers[1].leaseToken"),
        (lambda t: [OfferTicket(token="short")], "offers[0].leaseToken"),
        (lambda t: [OfferTicket(token="é" * 30)], "offers[0].leaseToken"),
        (lambda t: [], "offers"),
        (lambda t: [OfferTicket() for _ in range(9)], "offers"),
    ],
)
def test_malformed_offers_are_refused_naming_the_field(tickets, field):
    session = register(enrolled_worker(), max_concurrent=8)
    enqueue(make_revision()), enqueue(make_revision())
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        claim_raw(session, *tickets(OfferTicket()))
    assert (refused.value.code, refused.value.field) == ("validation_failed", field)
    assert lease_rows() == before


def test_a_draining_session_claims_nothing_new_but_may_replay():
    worker = enrolled_worker()
    session = register(worker, max_concurrent=2)
    revision = make_revision()
    enqueue(revision), enqueue(revision)
    ticket = OfferTicket()
    claim_raw(session, ticket)
    worker_drain(worker_id=worker.worker_id)
    with pytest.raises(DomainError) as refused:
        claim(session)
    assert refused.value.code == "session_draining"
    [again] = claim_raw(session, ticket)
    assert again.status == "idempotent"


def test_a_cancel_requested_run_is_no_candidate():
    session = register(enrolled_worker(), max_concurrent=2)
    revision = make_revision()
    first = enqueue(revision)
    held = claim_one(session)  # dispatched: the cancel waits for the worker to learn it
    run_cancel(run_id=first.pk)
    expire_lease(held.attempt_id)  # its worker never ACKs
    enqueue(revision)
    [other] = claim(session)
    assert RunAttempt.objects.get(pk=other.attempt_id).run_id != first.pk


def test_an_unstarted_lapsed_lease_is_taken_over_under_a_new_generation():
    slow, fast = register(enrolled_worker()), register(enrolled_worker())
    run = enqueue(make_revision())
    stale = claim_one(slow)
    expire_lease(stale.attempt_id)
    taken = claim_one(fast)
    assert (taken.attempt_id, taken.lease_generation) == (stale.attempt_id, 2)
    old = RunDispatchLease.objects.get(attempt_id=stale.attempt_id, lease_generation=1)
    assert (old.state, old.release_reason) == ("released", "dispatch_timeout")
    attempt = RunAttempt.objects.get(pk=stale.attempt_id)
    assert (attempt.number, attempt.state, attempt.session_id) == (1, "claimed", fast.session_id)
    assert Run.objects.get(pk=run.pk).attempt_count == 1  # the dispatch timeout consumed no try
    with pytest.raises(DomainError) as late:
        starting(stale)
    assert late.value.code == "lease_released"


def test_the_queue_pages_by_keyset_in_pages_of_at_most_64():
    revision = make_revision()
    for index in range(70):
        enqueue(revision, priority=index % 3)
    now = db_now()
    first = dispatch_queue_page(now=now, size=1000)
    assert len(first) == 64
    last = first[-1]
    rest = dispatch_queue_page(now=now, after=(last.priority, last.ready_at, last.pk))
    assert len(rest) == 6
    keys = [(-a.priority, a.ready_at, a.pk) for a in first + rest]
    assert keys == sorted(keys) and len(set(keys)) == 70


def test_a_claim_looks_past_the_first_page_for_a_placeable_attempt():
    session = register(enrolled_worker(), snap=snapshot(arch="x86_64"))
    elsewhere = make_revision(placement={"required": {"arch": ["aarch64"]}})
    for _ in range(80):
        enqueue(elsewhere, priority=5)
    wanted = enqueue(make_revision())
    held = claim_one(session)
    assert RunAttempt.objects.get(pk=held.attempt_id).run_id == wanted.pk


def test_a_claim_of_an_unknown_worker_or_session_is_refused():
    session = register(enrolled_worker())
    enqueue(make_revision())
    with pytest.raises(DomainError) as unknown:
        lease_claim(
            worker_id=uuid7(), session_id=session.session_id, generation=1, offers=[offer(OfferTicket())]
        )
    assert unknown.value.code == "worker_not_found"
    with pytest.raises(DomainError) as other:
        lease_claim(
            worker_id=session.worker.worker_id,
            session_id=uuid7(),
            generation=1,
            offers=[offer(OfferTicket())],
        )
    assert other.value.code == "session_unknown"
