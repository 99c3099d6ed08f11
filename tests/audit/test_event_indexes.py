"""The audit log's partial indexes (audit/models.py; docs/performance.md, "Claim and release"):
the claim loop's run events and two of its kinds enter fewer indexes, and every read that used an
index before still has it."""

from __future__ import annotations

import pytest
from django.urls import reverse

from api.metrics import DatabaseGauges
from audit.models import KIND_INDEX_EXCLUDES, Event
from console import dashboard
from core.db import db_now
from protocol.ids import uuid7
from tests.helpers import enrolled_worker, index_plans, register

pytestmark = pytest.mark.django_db


@pytest.mark.postgres
def test_the_dashboard_and_metrics_count_events_through_the_kind_index():
    plans = index_plans(lambda: dashboard.build(now=db_now()), "audit_event")
    plans += index_plans(lambda: list(DatabaseGauges().collect()), "audit_event")
    assert len(plans) == 2
    assert all("event_kind_time" in plan for plan in plans), plans


def test_the_kinds_left_out_of_the_kind_index_are_none_that_is_read_by_kind():
    read_by_kind = {*dashboard.FAILURE_KINDS, *dashboard.LOST_KINDS, "lease.claimed", "session.replaced"}
    assert not read_by_kind & set(KIND_INDEX_EXCLUDES)


@pytest.mark.postgres
def test_a_workers_events_are_read_through_the_worker_index(admin_client):
    worker = enrolled_worker()
    register(worker)
    page = reverse("admin:workers_worker_change", args=[worker.worker_id])
    plans = index_plans(lambda: admin_client.get(page), "audit_event")
    assert any("event_worker_kind_time" in plan for plan in plans), plans


def test_events_the_partial_indexes_leave_out_are_still_found_by_kind_run_and_worker():
    """Given a run event without a worker and a worker's event of each left-out kind, when they are
    filtered by kind, run or worker, then each is found: the partial indexes drop entries, not rows."""
    worker, run_id = enrolled_worker(), uuid7()
    made = [Event.objects.create(kind="run.dispatching", actor_type="worker", run_id=run_id)]
    made += [
        Event.objects.create(kind=kind, actor_type="worker", run_id=run_id, worker_id=worker.worker_id)
        for kind in KIND_INDEX_EXCLUDES
    ]
    assert list(Event.objects.filter(run_id=run_id).order_by("id")) == made
    newest = {event.kind: event for event in made}
    for kind in KIND_INDEX_EXCLUDES:
        assert Event.objects.filter(kind=kind).order_by("-id").first() == newest[kind]
    assert list(Event.objects.filter(worker_id=worker.worker_id, run_id=run_id).order_by("id")) == made[1:]
