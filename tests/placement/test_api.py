"""Operator views of placement: the pending run's summary, previews and candidate pages (API, admin)."""

from __future__ import annotations

import pytest

from actions.leases.claims import OfferRequest, lease_claim
from actions.sweeps import run_cycle
from tests.helpers import OfferTicket, enqueue, make_revision
from tests.placement.support import live

pytestmark = pytest.mark.django_db

PLACEMENT = {
    "required": {"arch": ["x86_64"], "runtimes": {"python": ">=3.9"}},
    "preferred": {"labels": [{"key": "zone", "value": "eu-1", "weight": 10}]},
}


def test_none_eligible_the_pending_run_shows_its_mismatch_summary_through_the_api(ops):
    polling = [live(f"arm-{index}", arch="aarch64") for index in range(3)]
    polling.append(live("old-python", runtimes=[{"name": "python", "version": "3.8.18"}]))
    for index in range(2):
        live(f"full-{index}", slots=0)
    run = enqueue(make_revision(placement=PLACEMENT))
    for worker, session in polling:  # every live worker with a slot asks for work: none may take it
        ticket = OfferTicket()
        assert (
            lease_claim(
                worker_id=worker.worker_id,
                session_id=session.session_id,
                generation=1,
                offers=[OfferRequest(ticket.offer_id, ticket.token)],
            )
            == []
        )
    run_cycle()
    answer = ops.get(f"/api/v1/ops/runs/{run.pk}")
    assert answer.status_code == 200
    body = answer.json()
    assert body["state"] == "queued"
    assert body["placementSummary"] == {"arch": 3, "runtime": 1, "capacity": 2}
    assert body["placementCheckedAt"] is not None


def test_placement_preview_lists_takers_by_rank_then_each_other_workers_category(ops):
    gold, _ = live("gold", labels={"zone": "eu-1"})
    live("plain", labels={})
    live("arm", arch="arm64")
    live("full", slots=0, labels={"zone": "eu-1"})
    revision = make_revision(placement=PLACEMENT)
    answer = ops.get(f"/api/v1/ops/revisions/{revision.pk}/placement-preview")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert (body["liveWorkers"], body["eligible"], body["summary"], body["truncated"]) == (4, 2, None, False)
    assert body["placement"]["required"]["arch"] == ["x86_64"]
    rows = [(r["workerName"], r["eligible"], r["score"], r["category"]) for r in body["workers"]]
    assert rows[:2] == [("gold", True, 10, None), ("plain", True, 0, None)]
    assert sorted(rows[2:], key=lambda r: r[0]) == [
        ("arm", False, 0, "arch"),
        ("full", False, 10, "capacity"),
    ]
    assert str(gold.worker_id) == body["workers"][0]["workerId"]


def test_preview_summary_when_no_worker_would_take_it(ops):
    live("arm", arch="arm64")
    revision = make_revision(placement=PLACEMENT)
    body = ops.get(f"/api/v1/ops/revisions/{revision.pk}/placement-preview").json()
    assert (body["eligible"], body["summary"]) == (0, {"arch": 1})


def test_preview_of_an_unknown_revision_is_404_and_it_needs_a_staff_token(ops, client):
    answer = ops.get("/api/v1/ops/revisions/0190f0f0-0000-7000-8000-000000000000/placement-preview")
    assert (answer.status_code, answer.json()["code"]) == (404, "revision_not_found")
    revision = make_revision()
    anonymous = client.get(f"/api/v1/ops/revisions/{revision.pk}/placement-preview")
    assert anonymous.status_code == 401


def test_run_candidate_pages_through_the_api(ops):
    for index in range(66):
        live(f"c-{index:02d}", labels={"zone": "eu-1" if index < 5 else "eu-2"})
    run = enqueue(make_revision(placement=PLACEMENT))
    first = ops.get(f"/api/v1/ops/runs/{run.pk}/candidates").json()
    assert len(first["candidates"]) == 64 and first["nextAfter"] is not None
    assert [c["score"] for c in first["candidates"][:5]] == [10] * 5
    assert {c["score"] for c in first["candidates"][5:]} == {0}
    ids = [c["workerId"] for c in first["candidates"]]
    assert ids[:5] == sorted(ids[:5]) and ids[5:] == sorted(ids[5:])
    second = ops.get(f"/api/v1/ops/runs/{run.pk}/candidates", after=first["nextAfter"]).json()
    assert len(second["candidates"]) == 2 and second["nextAfter"] is None
    assert not set(ids) & {c["workerId"] for c in second["candidates"]}
    bad = ops.get(f"/api/v1/ops/runs/{run.pk}/candidates", after="10:2")
    assert (bad.status_code, bad.json()["code"], bad.json()["field"]) == (400, "validation_failed", "after")
    missing = ops.get("/api/v1/ops/runs/0190f0f0-0000-7000-8000-000000000000/candidates")
    assert (missing.status_code, missing.json()["code"]) == (404, "run_not_found")


def test_admin_shows_the_preview_on_a_revision_and_why_a_run_waits(client, operator):
    live("gold", labels={"zone": "eu-1"})
    live("arm", arch="arm64")
    revision = make_revision(placement=PLACEMENT)
    waiting = enqueue(make_revision(placement={"required": {"arch": ["riscv64"]}}))
    run_cycle()
    client.force_login(operator)
    page = client.get(f"/admin/runs/taskrevision/{revision.pk}/change/").content.decode()
    assert "1 of 2 live workers would take it now" in page
    assert "<td>gold</td><td>takes it</td><td>10</td>" in page
    assert "<td>arm</td><td>no</td><td>0</td><td>2</td><td>arch</td>" in page
    listing = client.get("/admin/runs/run/").content.decode()
    assert "arch: 2" in listing
    detail = client.get(f"/admin/runs/run/{waiting.pk}/change/").content.decode()
    assert "arch: 2" in detail
