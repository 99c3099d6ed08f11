"""Lease expiry takeover under a real race: three workers claim at the same instant for one
attempt whose unstarted lease lapsed; exactly one takes it over under lease generation 2
(ADR-0012 §6 "lease expiry"; docs/leases.md, States)."""

from __future__ import annotations

import pytest

from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.concurrency.threads import race
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim, claim_one, expire_lease, starting

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_exactly_one_of_three_racing_workers_takes_over_a_lapsed_lease(protocol_settings):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)
    stale_session = register(enrolled_worker())
    run = enqueue(make_revision())
    stale = claim_one(stale_session)
    expire_lease(stale.attempt_id)
    racers = [register(enrolled_worker()) for _ in range(3)]

    results = race(*[lambda s=s: claim(s) for s in racers])

    assert all(kind == "ok" for kind, _ in results), results
    winners = [offers for _, offers in results if offers]
    assert len(winners) == 1 and len(winners[0]) == 1
    taken = winners[0][0]
    assert (taken.attempt_id, taken.lease_generation) == (stale.attempt_id, 2)
    leases = RunDispatchLease.objects.filter(attempt_id=stale.attempt_id).order_by("lease_generation")
    assert [(lease.lease_generation, lease.state, lease.release_reason) for lease in leases] == [
        (1, "released", "dispatch_timeout"),
        (2, "leased", ""),
    ]
    attempt = RunAttempt.objects.get(pk=stale.attempt_id)
    assert (attempt.number, attempt.state, attempt.session_id) == (1, "claimed", taken.session.session_id)
    assert Run.objects.get(pk=run.pk).attempt_count == 1
    with pytest.raises(DomainError) as late:  # the first holder's late ACK: the takeover stands
        starting(stale)
    assert late.value.code == "lease_released"
