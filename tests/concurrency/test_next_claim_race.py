"""A completion's next claim races other claims for the same work (docs/leases.md, "The next
claim"): each contender on its own thread and database connection, released at once. The freed
slot's claim is an ordinary claim: one queued run goes to exactly one contender, the session's
capacity holds against its own waiting claim, and the completion is recorded whoever wins."""

from __future__ import annotations

import pytest

from actions.leases.claims import OfferRequest, lease_claim
from actions.leases.next_claim import lease_complete_and_claim
from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import Run
from tests.concurrency.threads import race
from tests.helpers import OfferTicket, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import Held, claim_one, completion, start

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_dispatch_hold(protocol_settings):
    """Fresh runs go to whoever claims (the ranking's hold would keep them for the fleet's best)."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)


ROUNDS = 5


def offers(count: int = 1) -> list[OfferRequest]:
    return [OfferRequest(t.offer_id, t.token) for t in (OfferTicket() for _ in range(count))]


def complete_with_next(held: Held):
    return lease_complete_and_claim(**held.fence(), completion=completion(), offers=offers())


def plain_claim(session):
    try:
        return lease_claim(
            worker_id=session.worker.worker_id,
            session_id=session.session_id,
            generation=session.generation,
            offers=offers(),
        )
    except DomainError as refusal:
        return refusal


def claimed_runs(*answers) -> list:
    """The run ids the contenders' answers hold."""
    runs = []
    for outcome, value in answers:
        assert outcome == "ok", value
        if isinstance(value, tuple):  # the completion's answer and its next claim
            value = value[1].offers
        if isinstance(value, list):
            runs += [offer.lease.run_id for offer in value]
    return runs


def test_the_next_claim_and_another_workers_claim_take_one_queued_run_once():
    revision = make_revision()
    for _ in range(ROUNDS):
        finishing = register(enrolled_worker(), max_concurrent=1)
        other = register(enrolled_worker(), max_concurrent=1)
        enqueue(revision)
        held = start(claim_one(finishing))
        queued = enqueue(revision)
        answers = race(lambda held=held: complete_with_next(held), lambda other=other: plain_claim(other))
        assert claimed_runs(*answers) == [queued.pk]
        assert held.lease().state == "completed"
        assert RunDispatchLease.objects.filter(run_id=queued.pk).count() == 1
        assert not Run.objects.filter(state="queued").exists()


def test_the_next_claim_and_the_sessions_own_claim_never_exceed_its_capacity():
    revision = make_revision()
    for _ in range(ROUNDS):
        session = register(enrolled_worker(), max_concurrent=1)
        enqueue(revision)
        held = start(claim_one(session))
        enqueue(revision), enqueue(revision)
        answers = race(
            lambda held=held: complete_with_next(held), lambda session=session: plain_claim(session)
        )
        assert len(claimed_runs(*answers)) == 1  # one slot, one lease
        assert held.lease().state == "completed"
        assert RunDispatchLease.objects.filter(session_id=session.session_id, state="leased").count() == 1
