"""Live workers and candidate pages (ADR-0012 §4, docs/placement.md §5)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actions.leases.claims import OfferRequest, lease_claim
from actions.sessions.shutdown import session_drain, session_offline
from actions.workers import worker_drain, worker_revoke
from core.db import db_now
from core.errors import DomainError
from placement import spec
from placement.selectors import (
    PAGE_SIZE,
    LiveWorker,
    candidate_page,
    decode_cursor,
    encode_cursor,
    live_workers,
    mismatch_summary,
    placement_preview,
    ranked_candidates,
)
from protocol import capabilities as caps
from tests.helpers import BASE_SNAPSHOT, OfferTicket, enqueue, make_revision
from tests.placement.support import live
from workers.models import WorkerSession

ANY = spec.normalise({}, executor="shell").document


def ids(workers) -> set[str]:
    return {str(w.worker_id) for w in workers}


@pytest.mark.django_db
def test_draining_offline_revoked_expired_and_full_workers_never_appear():
    busy, busy_session = live("busy", max_concurrent=1)  # full: its one slot holds an active lease
    run = enqueue(make_revision())
    ticket = OfferTicket()
    taken = lease_claim(
        worker_id=busy.worker_id,
        session_id=busy_session.session_id,
        generation=1,
        offers=[OfferRequest(ticket.offer_id, ticket.token)],
    )
    assert [offer.lease.run_id for offer in taken] == [run.pk]
    healthy, _ = live("healthy")
    drained, drained_session = live("session-drained")
    session_drain(
        worker_id=drained.worker_id, session_id=drained_session.session_id, generation=1, expected_version=0
    )
    operator_drained, _ = live("operator-drained")
    worker_drain(worker_id=operator_drained.worker_id)
    offline, offline_session = live("offline")
    session_offline(
        worker_id=offline.worker_id, session_id=offline_session.session_id, generation=1, expected_version=0
    )
    revoked, _ = live("revoked")
    worker_revoke(worker_id=revoked.worker_id)
    expired, expired_session = live("lease-expired")
    WorkerSession.objects.filter(pk=expired_session.session_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )
    no_slots, _ = live("no-slots", slots=0)

    workers = live_workers(now=db_now())
    assert ids(workers) == {str(w.worker_id) for w in (healthy, no_slots, busy)}
    candidates = ranked_candidates(ANY, workers)
    assert ids(c.worker for c in candidates) == {str(healthy.worker_id)}
    assert all(c.worker.free_slots > 0 for c in candidates)


@pytest.mark.django_db
def test_a_worker_vanishes_the_moment_its_session_lease_lapses_without_a_sweep():
    worker, session = live()
    assert ids(live_workers(now=db_now())) == {str(worker.worker_id)}
    lease_end = WorkerSession.objects.get(pk=session.session_id).lease_expires_at
    assert live_workers(now=lease_end) == []
    assert ids(live_workers(now=lease_end - timedelta(microseconds=1))) == {str(worker.worker_id)}


@pytest.mark.django_db
def test_candidate_pages_hold_64_in_rank_order_and_the_keyset_covers_everyone_once():
    placement = spec.normalise(
        {
            "preferred": {
                "labels": [
                    {"key": "tier", "value": "gold", "weight": 50},
                    {"key": "disk", "value": "ssd", "weight": 7},
                ]
            }
        },
        executor="shell",
    ).document
    made = []
    for index in range(70):
        labels = {"tier": "gold" if index % 3 == 0 else "silver"}
        if index % 2:
            labels["disk"] = "ssd"
        worker, _ = live(f"page-{index:02d}", max_concurrent=4, slots=1 + index % 4, labels=labels)
        made.append(worker)
    workers = live_workers(now=db_now())
    first = candidate_page(placement, workers)
    assert len(first.candidates) == PAGE_SIZE and first.next_after is not None
    second = candidate_page(placement, workers, after=first.next_after)
    assert len(second.candidates) == 70 - PAGE_SIZE and second.next_after is None
    ordered = first.candidates + second.candidates
    assert ids(c.worker for c in ordered) == {str(w.worker_id) for w in made}
    keys = [(-c.score, -c.worker.free_slots, str(c.worker.worker_id)) for c in ordered]
    assert keys == sorted(keys) and len(set(keys)) == 70
    assert {c.score for c in ordered} == {0, 7, 50, 57}
    assert candidate_page(placement, workers, size=500).candidates == first.candidates


def synthetic(index: int, score_label: str, free: int, taken: int) -> LiveWorker:
    snapshot = caps.snapshot({**BASE_SNAPSHOT, "labels": {"tier": score_label}}).document
    return LiveWorker(
        worker_id=uuid.UUID(int=index),
        worker_name=f"w{index}",
        session_id=uuid.UUID(int=10**6 + index),
        generation=1,
        capabilities=snapshot,
        max_concurrent_runs=4,
        available_slots=free,
        active_leases=taken,
    )


WORKERS = st.lists(
    st.tuples(st.sampled_from(["gold", "silver", "bronze"]), st.integers(0, 4), st.integers(0, 4)),
    max_size=200,
).map(lambda rows: [synthetic(i, *row) for i, row in enumerate(rows)])
PLACEMENT = spec.normalise(
    {
        "preferred": {
            "labels": [
                {"key": "tier", "value": "gold", "weight": 30},
                {"key": "tier", "value": "silver", "weight": 10},
            ]
        }
    },
    executor="shell",
).document


@settings(max_examples=100, deadline=None)
@given(WORKERS, st.integers(1, 100))
def test_paging_any_worker_set_is_bounded_ordered_and_complete(workers, size):
    expected = ranked_candidates(PLACEMENT, workers)
    assert all(c.worker.free_slots > 0 for c in expected)
    assert {str(c.worker.worker_id) for c in expected} == {
        str(w.worker_id) for w in workers if w.free_slots > 0
    }
    pages, after = [], None
    while True:
        page = candidate_page(PLACEMENT, workers, after=after, size=size)
        assert len(page.candidates) <= min(size, PAGE_SIZE)
        pages.extend(page.candidates)
        if page.next_after is None:
            break
        assert decode_cursor(encode_cursor(page.next_after)) == page.next_after
        after = page.next_after
    assert pages == expected
    ranks = [c.rank for c in pages]
    assert ranks == sorted(ranks)


@settings(max_examples=100, deadline=None)
@given(WORKERS)
def test_summary_and_preview_agree_and_hold_categories_only(workers):
    placement = spec.normalise({"required": {"labels": {"tier": "gold"}}}, executor="shell").document
    summary = mismatch_summary(placement, workers)
    preview = placement_preview(placement, workers)
    assert preview.summary == summary
    assert preview.live_workers == len(workers) and len(preview.rows) == min(len(workers), PAGE_SIZE)
    takers = [w for w in workers if w.capabilities["labels"]["tier"] == "gold" and w.free_slots > 0]
    assert preview.eligible == len(takers)
    if takers:
        assert summary is None
    elif not workers:
        assert summary == {}
    else:
        assert set(summary) <= {"labels", "capacity"}
        assert sum(summary.values()) == len(workers)
        assert summary.get("capacity", 0) == sum(
            1 for w in workers if w.capabilities["labels"]["tier"] == "gold"
        )
    shown = [row.eligible for row in preview.rows]
    assert shown == sorted(shown, reverse=True)  # takers first


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1:2",
        "a:1:00000000-0000-0000-0000-000000000000",
        "1:1:00000000-0000-0000-0000-00000000000G",
        "01:1:00000000-0000-0000-0000-000000000000",
        "1:1:00000000-0000-0000-0000-000000000000\n",
    ],
)
def test_bad_cursors_are_a_validation_error_naming_after(text):
    with pytest.raises(DomainError) as refused:
        decode_cursor(text)
    assert (refused.value.code, refused.value.field) == ("validation_failed", "after")
