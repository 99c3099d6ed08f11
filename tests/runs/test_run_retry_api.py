"""Task and run API parity (issue 11): tasks and revisions are listed and read, a finished run is
retried as a new run linked to it (audited, refused while live), and lists page with a cursor."""

from __future__ import annotations

import pytest

from actions.runs import run_cancel
from audit.models import Event
from runs.models import Run
from tests.helpers import enqueue, make_revision, operator_headers

pytestmark = pytest.mark.django_db

OPS = "/api/v1/ops/"


def post(client, path, body, headers):
    return client.post(OPS + path, body, content_type="application/json", headers=headers)


def test_a_finished_run_is_retried_as_a_new_linked_run_and_audited(client):
    headers = operator_headers("retrier", role="operator")
    run = enqueue(make_revision(name="flaky"))
    live = post(client, f"runs/{run.pk}/retry", {}, headers)
    assert (live.status_code, live.json()["code"]) == (409, "run_not_finished")
    run_cancel(run_id=run.pk)

    answer = post(client, f"runs/{run.pk}/retry", {}, headers)

    assert answer.status_code == 201, answer.json()
    retried = answer.json()
    assert retried["retryOf"] == str(run.pk) and retried["state"] == "queued" and retried["id"] != str(run.pk)
    assert retried["revisionId"] == str(run.revision_id)
    assert Run.objects.get(pk=run.pk).state == "cancelled"  # the old run is history, unchanged
    event = Event.objects.get(kind="run.retried", run_id=run.pk)
    assert (event.actor, event.data) == ("retrier", {"role": "operator"})
    assert post(client, f"runs/{run.pk}/retry", {"why": 1}, headers).json()["field"] == "why"
    missing = post(client, "runs/01900000-0000-7000-8000-000000000000/retry", {}, headers)
    assert (missing.status_code, missing.json()["code"]) == (404, "run_not_found")


def test_tasks_and_revisions_are_listed_and_read(client):
    headers = operator_headers("reader", role="viewer")
    make_revision(name="alpha")
    make_revision(name="beta", env={"TOKEN": "s3cr3t-value"})
    tasks = client.get(OPS + "tasks", headers=headers)
    assert tasks.status_code == 200 and [t["name"] for t in tasks.json()["results"]] == ["alpha", "beta"]
    assert client.get(OPS + "tasks/beta", headers=headers).json()["name"] == "beta"
    revisions = client.get(OPS + "tasks/beta/revisions", headers=headers).json()["results"]
    assert [(r["number"], r["envNames"]) for r in revisions] == [(1, ["TOKEN"])]
    one = client.get(OPS + "tasks/beta/revisions/1", headers=headers)
    assert one.json()["command"] == "true" and "s3cr3t-value" not in one.content.decode()
    assert client.get(OPS + "tasks/beta/revisions/2", headers=headers).json()["code"] == "revision_not_found"
    assert client.get(OPS + "tasks/gamma", headers=headers).json()["code"] == "task_not_found"


def test_runs_page_with_a_cursor_past_a_hundred(client):
    headers = operator_headers("pager", role="viewer")
    revision = make_revision(name="many")
    made = {str(enqueue(revision).pk) for _ in range(120)}
    seen, url = [], OPS + "runs?limit=50&task=many"
    while url:
        page = client.get(url, headers=headers).json()
        seen += [r["id"] for r in page["results"]]
        url = page["next"]
    assert len(seen) == 120 and set(seen) == made and seen == sorted(seen, reverse=True)
