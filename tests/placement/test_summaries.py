"""Explainable pending: mismatch summaries refreshed each dispatch cycle (ADR-0012 §4, invariant 10)."""

from __future__ import annotations

import json
import logging

import pytest

from actions.leases.claims import OfferRequest, lease_claim
from actions.placement import SummaryChange, placement_summaries_store, refresh_placement_summaries
from actions.runs import run_cancel
from actions.sessions.heartbeat import session_heartbeat
from actions.sweeps import run_cycle
from actions.workers import worker_drain
from audit.models import Event
from core.db import db_now
from placement.matching import SUMMARY_CATEGORIES
from placement.selectors import describe_summary
from runs.models import Run
from tests.helpers import OfferTicket, enqueue, make_revision
from tests.placement.support import live
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db

#: Looks like a secret on purpose: it must never reach an event or a log line.
SECRET = "hunter2-Token"

PLACEMENT = {
    "required": {"arch": ["x86_64"], "runtimes": {"python": ">=3.9"}, "labels": {"vault": SECRET}},
    "preferred": {"labels": [{"key": "zone", "value": "eu-1", "weight": 10}]},
}


def fleet():
    """3 arm workers, 1 with an old python, 2 that fit but have no free slot."""
    for index in range(3):
        live(f"arm-{index}", arch="arm64", labels={"vault": SECRET})
    live("old-python", runtimes=[{"name": "python", "version": "3.8.18"}], labels={"vault": SECRET})
    full = [live(f"full-{index}", slots=0, labels={"vault": SECRET, "zone": "eu-1"}) for index in range(2)]
    return full


def summary_of(run) -> dict | None:
    return Run.objects.get(pk=run.pk).placement_summary


def test_a_run_nobody_can_take_carries_category_counts_and_they_follow_the_fleet(caplog):
    full = fleet()
    run = enqueue(make_revision(placement=PLACEMENT))
    caplog.set_level(logging.INFO)
    assert refresh_placement_summaries() == 1
    assert summary_of(run) == {"arch": 3, "runtime": 1, "capacity": 2}
    assert Run.objects.get(pk=run.pk).state == "queued"
    events = list(Event.objects.filter(kind="run.placement_pending", run_id=run.pk))
    assert [event.data for event in events] == [{"summary": {"arch": 3, "capacity": 2, "runtime": 1}}]
    assert "waits for placement: arch: 3, runtime: 1, capacity: 2" in caplog.text

    # A steady backlog costs reads, not writes.
    before = (Event.objects.count(), Run.objects.get(pk=run.pk).placement_checked_at)
    assert refresh_placement_summaries() == 0
    assert (Event.objects.count(), Run.objects.get(pk=run.pk).placement_checked_at) == before

    # One full worker frees a slot: a live worker could take it now, so nothing is left to explain.
    worker, session = full[0]
    session_heartbeat(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        expected_version=session.version,
        available_slots=1,
    )
    assert refresh_placement_summaries() == 1
    assert summary_of(run) is None
    assert Event.objects.filter(kind="run.placement_pending").count() == 1


def test_no_live_worker_at_all_is_an_empty_summary():
    run = enqueue(make_revision(placement=PLACEMENT))
    assert refresh_placement_summaries() == 1
    assert summary_of(run) == {}
    assert Event.objects.get(kind="run.placement_pending").data == {"summary": {}}


def test_events_and_logs_hold_categories_only_never_labels_or_values(caplog):
    caplog.set_level(logging.DEBUG)
    fleet()
    taker, taker_session = live("taker", labels={"vault": SECRET, "zone": "eu-1"})
    run = enqueue(make_revision(placement=PLACEMENT))
    waiting = enqueue(make_revision(placement={"required": {"labels": {"vault": "other-" + SECRET}}}))
    run_cycle()
    ticket = OfferTicket()
    offers = lease_claim(
        worker_id=taker.worker_id,
        session_id=taker_session.session_id,
        generation=1,
        offers=[OfferRequest(ticket.offer_id, ticket.token)],
    )
    assert [offer.lease.run_id for offer in offers] == [run.pk]
    run_cycle()
    assert summary_of(waiting) == {"labels": 7}
    for event in Event.objects.all():
        text = json.dumps(event.data)
        assert SECRET not in text and "vault" not in text and "eu-1" not in text and "python" not in text, (
            event.kind
        )
        if event.kind == "run.placement_pending":
            assert set(event.data) == {"summary"} and set(event.data["summary"]) <= set(SUMMARY_CATEGORIES)
    assert SECRET not in caplog.text and "vault" not in caplog.text


def test_a_run_claimed_between_the_read_and_the_write_keeps_no_summary():
    worker, session = live("only")
    run = enqueue(make_revision(placement={"required": {"labels": {"zone": "eu-1"}}}))
    now = db_now()
    stale = SummaryChange(run_id=run.pk, before=None, before_checked_at=None, after={"labels": 1})
    ticket = OfferTicket()
    lease_claim(
        worker_id=worker.worker_id,
        session_id=session.session_id,
        generation=1,
        offers=[OfferRequest(ticket.offer_id, ticket.token)],
    )
    assert placement_summaries_store(changes=[stale], checked_at=now) == 0
    assert summary_of(run) is None


def test_a_summary_written_by_another_cycle_in_between_is_not_overwritten():
    run = enqueue(make_revision(placement=PLACEMENT))
    refresh_placement_summaries()
    assert summary_of(run) == {}
    late = SummaryChange(run_id=run.pk, before=None, before_checked_at=None, after={"arch": 9})
    assert placement_summaries_store(changes=[late], checked_at=db_now()) == 0
    assert summary_of(run) == {}


def test_cancelled_runs_are_left_alone():
    run = enqueue(make_revision(placement=PLACEMENT))
    run_cancel(run_id=run.pk)
    assert refresh_placement_summaries() == 0
    assert summary_of(run) is None


def test_a_long_backlog_is_covered_in_turn_across_cycles():
    runs = [enqueue(make_revision(placement={"required": {"labels": {"rack": f"r{i}"}}})) for i in range(5)]
    live("somebody")
    assert refresh_placement_summaries(batch=2) == 2
    assert [summary_of(r) for r in runs] == [{"labels": 1}, {"labels": 1}, None, None, None]
    assert refresh_placement_summaries(batch=2) == 2
    assert refresh_placement_summaries(batch=2) == 1
    assert all(summary_of(r) == {"labels": 1} for r in runs)
    # The window wrapped around to the head: nothing changed, nothing written.
    assert refresh_placement_summaries(batch=2) == 0


def test_a_stored_summary_reads_in_the_fixed_category_order_on_either_database():
    run = enqueue(
        make_revision(placement={"required": {"runtimes": {"python": ">=3.12"}, "labels": {"rack": "r9"}}})
    )
    new_python = [{"name": "python", "version": "3.12.1"}]
    live("old-python")
    live("no-rack", runtimes=new_python)
    live("full", runtimes=new_python, slots=0, labels={"rack": "r9"})
    refresh_placement_summaries()
    stored = Run.objects.get(pk=run.pk).placement_summary  # jsonb orders keys by length: labels, runtime, …
    # old-python fails both runtime and labels: every failing category counts, not the first only
    assert stored == {"runtime": 1, "labels": 2, "capacity": 1}
    assert describe_summary(stored) == "runtime: 1, labels: 2, capacity: 1"


def test_a_draining_worker_and_a_lapsed_one_are_told_apart_from_no_worker_at_all():
    """Given one live worker of the wrong arch, one drained by an operator and one whose session
    lease lapsed (not yet swept), the summary names all three, and the text says no live worker
    could take it rather than "no live worker" alone."""
    live("wrong-arch", arch="arm64")
    drained, _ = live("drained")
    worker_drain(worker_id=drained.worker_id)
    lapsed, lapsed_session = live("lapsed")
    WorkerSession.objects.filter(pk=lapsed_session.session_id).update(lease_expires_at=db_now())
    run = enqueue(make_revision(placement={"required": {"arch": ["x86_64"]}}))
    refresh_placement_summaries()
    assert summary_of(run) == {"arch": 1, "draining": 1, "expired": 1}
    assert describe_summary(summary_of(run)) == "arch: 1, draining: 1, expired: 1"
    assert describe_summary({"draining": 1}) == "no live worker; draining: 1"
    assert describe_summary({}) == "no live worker"


def test_a_worker_failing_several_categories_counts_under_each():
    live("arm-small", arch="arm64", memoryMiB=512)
    live("arm", arch="arm64")
    run = enqueue(make_revision(placement={"required": {"arch": ["x86_64"], "minMemoryMiB": 1024}}))
    refresh_placement_summaries()
    assert summary_of(run) == {"arch": 2, "memory": 1}
