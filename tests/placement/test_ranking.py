"""Claim-time ranking: a claimer leaves a fresh run to a strictly better-ranked live worker."""

from __future__ import annotations

from datetime import timedelta

import pytest

from actions.leases.claims import OfferRequest, lease_claim
from actions.sessions.shutdown import session_drain
from core.db import db_now
from leases.models import RunDispatchLease
from placement import spec
from placement.ranking import ClaimRanking
from runs.models import RunAttempt
from tests.helpers import OfferTicket, enqueue, make_revision
from tests.placement.support import live
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db

PREFER_GOLD = {"preferred": {"labels": [{"key": "tier", "value": "gold", "weight": 50}]}}
PLACEMENT = spec.normalise(PREFER_GOLD, executor="shell")


class Attempt:
    def __init__(self, ready_at):
        self.ready_at = ready_at


class Claimer:
    def __init__(self, worker):
        self.pk = worker.worker_id


def claim(worker, session):
    ticket = OfferTicket()
    return lease_claim(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        offers=[OfferRequest(ticket.offer_id, ticket.token)],
    )


def test_a_worse_scored_claimer_defers_a_fresh_attempt_and_the_best_takes_it():
    silver, silver_session = live("silver", labels={"tier": "silver"})
    gold, gold_session = live("gold", labels={"tier": "gold"})
    run = enqueue(make_revision(placement=PREFER_GOLD))
    assert claim(silver, silver_session) == []
    offers = claim(gold, gold_session)
    assert [offer.lease.run_id for offer in offers] == [run.pk]


def test_an_attempt_older_than_the_hold_goes_to_any_eligible_claimer():
    silver, silver_session = live("silver", labels={"tier": "silver"})
    live("gold", labels={"tier": "gold"})
    run = enqueue(make_revision(placement=PREFER_GOLD))
    RunAttempt.objects.filter(run=run).update(ready_at=db_now() - timedelta(seconds=11))  # hold: 10 s
    assert [offer.lease.run_id for offer in claim(silver, silver_session)] == [run.pk]


@pytest.mark.parametrize("how", ["full", "draining", "ineligible", "expired"])
def test_a_better_worker_that_could_not_take_it_is_not_waited_for(how):
    silver, silver_session = live("silver", labels={"tier": "silver"})
    if how == "full":
        live("gold", slots=0, labels={"tier": "gold"})
    elif how == "ineligible":
        live("gold", arch="arm64", labels={"tier": "gold"})
    else:
        gold, gold_session = live("gold", labels={"tier": "gold"})
        if how == "draining":
            session_drain(
                worker_id=gold.worker_id, session_id=gold_session.session_id, generation=1, expected_version=0
            )
        else:
            WorkerSession.objects.filter(pk=gold_session.session_id).update(lease_expires_at=db_now())
    run = enqueue(make_revision(placement={**PREFER_GOLD, "required": {"arch": ["x86_64"]}}))
    assert [offer.lease.run_id for offer in claim(silver, silver_session)] == [run.pk]


def test_ties_break_on_free_slots_then_on_worker_id():
    roomy, _ = live("roomy", max_concurrent=4, labels={"tier": "gold"})
    first, _ = live("first", max_concurrent=2, labels={"tier": "gold"})
    second, _ = live("second", max_concurrent=2, labels={"tier": "gold"})
    low, high = sorted([first, second], key=lambda w: str(w.worker_id))
    now = db_now()
    fresh = Attempt(now)
    assert not ClaimRanking(Claimer(roomy), 4, now).defer(fresh, PLACEMENT.sha256, PLACEMENT.document, 50)
    assert ClaimRanking(Claimer(low), 2, now).defer(fresh, PLACEMENT.sha256, PLACEMENT.document, 50)
    # Without the roomy worker, the lower worker id wins the tie.
    WorkerSession.objects.filter(worker_id=roomy.worker_id).update(lease_expires_at=now)
    assert not ClaimRanking(Claimer(low), 2, now).defer(fresh, PLACEMENT.sha256, PLACEMENT.document, 50)
    assert ClaimRanking(Claimer(high), 2, now).defer(fresh, PLACEMENT.sha256, PLACEMENT.document, 50)
    assert not ClaimRanking(Claimer(high), 2, now).defer(
        Attempt(now - timedelta(seconds=10)), PLACEMENT.sha256, PLACEMENT.document, 50
    )


def test_deferring_reads_only():
    silver, silver_session = live("silver", labels={"tier": "silver"})
    live("gold", labels={"tier": "gold"})
    run = enqueue(make_revision(placement=PREFER_GOLD))
    before = list(RunAttempt.objects.filter(run=run).values())
    assert claim(silver, silver_session) == []
    assert list(RunAttempt.objects.filter(run=run).values()) == before
    assert RunDispatchLease.objects.count() == 0
