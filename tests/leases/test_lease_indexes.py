"""The lease table's indexes after ``leases/0008`` (docs/performance.md, "Claim and release"): a
session's active leases and a run's leases are still read through an index."""

from __future__ import annotations

import pytest
from django.urls import reverse

from leases.selectors import active_lease_count
from tests.helpers import enqueue, enrolled_worker, index_plans, make_revision, register
from tests.leases.flows import claim_one

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


def test_a_sessions_active_leases_are_counted_through_the_partial_session_index():
    session = register(enrolled_worker())
    (plan,) = index_plans(lambda: active_lease_count(session.session_id), "leases_rundispatchlease")
    assert "lease_active_session" in plan, plan


def test_the_run_page_reads_a_runs_leases_through_its_attempts(admin_client):
    session = register(enrolled_worker())
    run = enqueue(make_revision())
    claim_one(session)
    page = reverse("admin:runs_run_change", args=[run.pk])
    plans = index_plans(lambda: admin_client.get(page), "leases_rundispatchlease")
    assert any("lease_generation_unique" in plan for plan in plans), plans
