"""The landing dashboard: right figures, links to the filtered lists, a fixed number of queries,
and fast with a 100k-run backlog."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.urls import reverse

from actions.placement import refresh_placement_summaries
from console import dashboard
from core.db import db_now
from runs.models import Run, RunAttempt
from runs.states import AttemptState, RunState
from tests.console.fixtures import PASSWORD, fleet_in_every_state, make_user
from tests.helpers import make_revision

pytestmark = pytest.mark.django_db

#: fleet, live sessions, leases, run states, queue head, events, oldest queued.
QUERIES = 7


def values(figures):
    return {figure.label: figure.value for figure in figures}


def test_figures_count_each_state_and_link_to_the_filtered_list(client, protocol_settings):
    protocol_settings(SESSION_LEASE_SECONDS=900)  # "online" must stay online however slow the machine
    fleet_in_every_state()
    refresh_placement_summaries()
    board = dashboard.build(now=db_now())
    workers = values(board.workers)
    assert {k: workers[k] for k in ("online", "draining", "expired", "offline", "new", "revoked")} == {
        "online": 1,
        "draining": 1,
        "expired": 1,
        "offline": 1,
        "new": 1,
        "revoked": 1,
    }
    assert workers["outdated"] == 2  # the test sessions report test/1, not qinglong-worker/<version>
    assert board.capacity.value == "1 / 4"  # one running attempt; online 2 + draining 2 slots
    assert values(board.runs) == {"queued": 1, "dispatching": 0, "running": 1, "retry waiting": 1}
    assert values(board.reasons) == {"arch": 1, "draining": 1, "expired": 1}
    health = values(board.health)
    assert (
        health["failures, last hour"] == 3 and health["lost attempts, last day"] == 1
    )  # failed ×2, timed out
    make_user("viewer")
    assert client.login(username="viewer", password=PASSWORD)
    for figure in [*board.workers, board.capacity, *board.runs, *board.reasons, *board.health, board.oldest]:
        answer = client.get(figure.url)
        assert answer.status_code == 200, figure
    expired = client.get(next(f.url for f in board.workers if f.label == "expired")).content.decode()
    assert "lapsed-1" in expired and "online-1" not in expired
    waiting = client.get(next(f.url for f in board.reasons if f.label == "arch")).content.decode()
    assert "arm-only" in waiting and "sample-task" not in waiting


def test_the_dashboard_takes_a_fixed_number_of_queries(django_assert_num_queries):
    fleet_in_every_state()
    now = db_now()
    with django_assert_num_queries(QUERIES):
        dashboard.build(now=now)


def test_the_landing_page_polls_its_figures(client):
    make_user("viewer")
    assert client.login(username="viewer", password=PASSWORD)
    page = client.get(reverse("admin:index")).content.decode()
    assert 'data-ql-refresh="/admin/?fragment=1"' in page
    fragment = client.get(reverse("admin:index") + "?fragment=1").content.decode()
    assert 'data-figure="workers-online"' in fragment and "<html" not in fragment


@pytest.mark.slow
def test_the_dashboard_stays_fast_with_a_100k_run_backlog(django_assert_num_queries):
    """Given 100,000 queued runs (bulk-inserted: the write paths are not what is measured), the
    dashboard still takes the same queries and well under a second."""
    revision = make_revision(placement={"required": {"arch": ["aarch64"]}})
    now = db_now()
    batch = 5000
    for start in range(0, 100_000, batch):
        runs = [
            Run(
                task_id=revision.task_id,
                revision=revision,
                state=RunState.QUEUED,
                attempt_count=1,
                created_at=now - timedelta(seconds=100_000 - start - i),
                placement_summary={"arch": 3} if i % 2 else None,
            )
            for i in range(batch)
        ]
        Run.objects.bulk_create(runs)
        RunAttempt.objects.bulk_create(
            RunAttempt(
                run=run,
                number=1,
                state=AttemptState.CLAIMED,
                ready_at=run.created_at,
                created_at=run.created_at,
                placement_sha256=revision.placement_sha256,
            )
            for run in runs
        )
    dashboard.build(now=now)  # warm caches
    now = db_now()
    started = time.perf_counter()
    with django_assert_num_queries(QUERIES):
        board = dashboard.build(now=now)
    elapsed = time.perf_counter() - started
    print(f"dashboard over 100k queued runs: {elapsed * 1000:.0f} ms, {QUERIES} queries")

    assert values(board.runs)["queued"] == 100_000
    assert values(board.reasons) == {"arch": dashboard.REASON_WINDOW // 2}
    assert board.oldest.value.startswith("27 h")
    assert elapsed < 1.0, f"dashboard took {elapsed:.3f} s over 100k queued runs"
