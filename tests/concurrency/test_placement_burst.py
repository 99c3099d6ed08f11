"""A burst of fresh runs and a fleet of idle, equally ranked workers: everyone claims at once.

Ranking shares the head of the queue out in rank order (placement.ranking): workers ranked above
a claimer are entitled to as many fresh attempts as they have free slots, and the claimer takes
the next. So N identical idle one-slot workers polling together take N waiting runs in one round — none
comes back empty-handed while work it may run is waiting — and the best-ranked worker still gets
the first run in the queue.
"""

from __future__ import annotations

import pytest

from runs.models import Run
from tests.concurrency.test_placement_race import poll_at_once
from tests.helpers import enqueue, make_revision
from tests.placement.support import live

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("round_", range(3))
def test_n_identical_workers_take_n_runs_in_one_round(round_):
    workers = [live(f"twin-{round_}-{index}", max_concurrent=1) for index in range(4)]
    revision = make_revision()
    runs = [enqueue(revision) for _ in range(4)]
    results = poll_at_once(workers)
    errors = [r for got in results.values() for r in got if isinstance(r, Exception)]
    assert not errors, errors
    assert all(len(got) == 1 for got in results.values()), results
    assert sorted(run for got in results.values() for run in got) == sorted(r.pk for r in runs)
    best = min(workers, key=lambda pair: str(pair[0].worker_id))[0]
    assert results[best.name] == [runs[0].pk]  # the queue's head goes to the best-ranked worker
    assert Run.objects.filter(state="dispatching").count() == 4
