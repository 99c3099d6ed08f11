"""Deleting a worker, session, run, attempt or lease row never strands a started attempt (issue
11): the ORM refuses (``PROTECT``), the database refuses a raw delete of a referenced row too,
and the admin offers no delete for them."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError

from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, operator_user, register
from tests.leases.flows import claim_one, start
from workers.models import Worker, WorkerSession

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def started():
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(make_revision())
    held = claim_one(session)
    start(held)
    assert RunAttempt.objects.get(run=run).started_at is not None
    return worker, session, run, held


def _raw_delete(table: str, pk) -> None:
    value = pk.hex if connection.vendor == "sqlite" else str(pk)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [value])  # noqa: S608 - fixed table names


def test_the_orm_refuses_to_delete_what_a_started_attempt_points_at(started):
    worker, session, run, _ = started
    for rows in (
        Worker.objects.filter(pk=worker.worker_id),
        WorkerSession.objects.filter(pk=session.session_id),
        Run.objects.filter(pk=run.pk),
        RunAttempt.objects.filter(run=run),
    ):
        with pytest.raises(ProtectedError):
            rows.delete()
    assert RunDispatchLease.objects.filter(run=run, state="leased").count() == 1
    assert Run.objects.get(pk=run.pk).state != "lost"


@pytest.mark.parametrize(
    ("table", "target"),
    [
        ("workers_worker", lambda w, s, r: w.worker_id),
        ("workers_workersession", lambda w, s, r: s.session_id),
        ("runs_run", lambda w, s, r: r.pk),
    ],
)
def test_the_database_refuses_a_raw_delete_too(started, table, target):
    worker, session, run, _ = started
    with pytest.raises(IntegrityError):
        _raw_delete(table, target(worker, session, run))
    assert Worker.objects.filter(pk=worker.worker_id).exists()
    assert (
        RunDispatchLease.objects.filter(run=run, session_id=session.session_id, state="leased").count() == 1
    )


def test_the_admin_offers_no_delete_for_them(client, started):
    worker, session, run, _ = started
    client.force_login(operator_user("root", superuser=True))
    for url in (
        f"/admin/workers/worker/{worker.worker_id}/delete/",
        f"/admin/workers/workersession/{session.session_id}/delete/",
        f"/admin/runs/run/{run.pk}/delete/",
        f"/admin/leases/rundispatchlease/{RunDispatchLease.objects.get(run=run).pk}/delete/",
    ):
        assert client.post(url, {"post": "yes"}).status_code == 403, url
    assert Worker.objects.filter(pk=worker.worker_id).exists()
    assert RunDispatchLease.objects.filter(run=run).count() == 1
