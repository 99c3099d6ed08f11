"""Real races over placement: several workers poll at once (threads, a barrier, one connection each).

ADR-0012 §4 orders candidates by (score desc, free slots desc, worker id asc); in a pull model
that order must still decide who gets a fresh run when eligible workers ask at the same moment.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from actions.leases.claims import OfferRequest, lease_claim
from actions.sweeps import run_cycle
from core.db import db_now
from leases.models import LeaseState, RunDispatchLease
from placement.selectors import live_workers
from tests.helpers import OfferTicket, api_token, enqueue, make_revision, operator_user
from tests.placement.support import OperatorClient, live

pytestmark = pytest.mark.django_db(transaction=True)

PREFER = {
    "preferred": {
        "labels": [
            {"key": "tier", "value": "gold", "weight": 50},
            {"key": "tier", "value": "silver", "weight": 20},
        ]
    }
}


def poll_at_once(workers) -> dict[str, list]:
    """Every (worker, session) asks for one run at the same instant; returns name -> run ids or error."""
    barrier = threading.Barrier(len(workers))
    results: dict[str, list] = {}

    def poll(worker, session):
        try:
            ticket = OfferTicket()
            barrier.wait(timeout=10)
            offers = lease_claim(
                worker_id=worker.worker_id,
                session_id=session.session_id,
                generation=session.generation,
                offers=[OfferRequest(ticket.offer_id, ticket.token)],
            )
            results[worker.name] = [offer.lease.run_id for offer in offers]
        except Exception as exc:  # reported below, with the worker that hit it
            results[worker.name] = [exc]
        finally:
            connection.close()

    threads = [threading.Thread(target=poll, args=pair) for pair in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


@pytest.mark.parametrize("decided_by", ["score", "free slots", "worker id"])
def test_three_eligible_workers_polling_at_once_the_best_ranked_gets_the_run(decided_by):
    if decided_by == "score":
        workers = [
            live("bronze", labels={"tier": "bronze"}),
            live("gold", labels={"tier": "gold"}),
            live("silver", labels={"tier": "silver"}),
        ]
        best = "gold"
    elif decided_by == "free slots":
        workers = [
            live("two", max_concurrent=2, labels={"tier": "gold"}),
            live("four", max_concurrent=4, labels={"tier": "gold"}),
            live("three", max_concurrent=3, labels={"tier": "gold"}),
        ]
        best = "four"
    else:
        workers = [live(f"same-{index}", labels={"tier": "gold"}) for index in range(3)]
        best = min(workers, key=lambda pair: str(pair[0].worker_id))[0].name
    assert len(live_workers(now=db_now())) == 3
    run = enqueue(make_revision(placement=PREFER))

    results = poll_at_once(workers)

    assert results[best] == [run.pk], results
    assert all(results[w.name] == [] for w, _ in workers if w.name != best), results
    lease = RunDispatchLease.objects.get()
    assert (lease.run_id, lease.state, lease.worker.name) == (run.pk, LeaseState.LEASED, best)


def test_none_eligible_polling_at_once_nobody_claims_and_the_api_explains(client, django_user_model):
    workers = [live(f"arm-{index}", arch="arm64") for index in range(3)]
    workers.append(live("old-python", runtimes=[{"name": "python", "version": "3.8.0"}]))
    live("full", slots=0)
    run = enqueue(
        make_revision(placement={"required": {"arch": ["x86_64"], "runtimes": {"python": ">=3.9"}}})
    )

    results = poll_at_once(workers)

    assert results == {w.name: [] for w, _ in workers}
    assert RunDispatchLease.objects.count() == 0
    run_cycle()
    operator = operator_user("race-operator", role="viewer")
    body = OperatorClient(client, api_token(operator, role="viewer")).get(f"/api/v1/ops/runs/{run.pk}").json()
    assert (body["state"], body["placementSummary"]) == ("queued", {"arch": 3, "runtime": 1, "capacity": 1})
