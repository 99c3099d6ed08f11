"""The worker management API (``/api/v1/ops/``): lists with filters and cursor pages, details,
the enrollment token shown once, sessions, the audit log — and every bad input a 4xx naming the
field."""

from __future__ import annotations

import base64

import pytest

from actions.workers import worker_drain, worker_revoke
from tests.helpers import enrolled_worker, operator_headers, register, snapshot

pytestmark = pytest.mark.django_db

OPS = "/api/v1/ops/"


@pytest.fixture
def admin_headers():
    return operator_headers("fleet", role="admin")


@pytest.fixture
def viewer_headers():
    return operator_headers("watcher", role="viewer")


def get(client, path, headers):
    return client.get(OPS + path, headers=headers)


def test_workers_filter_by_state_and_label_and_page_with_a_cursor(client, viewer_headers):
    for index in range(5):
        worker = enrolled_worker(f"box-{index}")
        register(worker, snap=snapshot(labels={"zone": "eu-1" if index % 2 else "us-2"}))
        if index == 4:
            worker_drain(worker_id=worker.worker_id)
    revoked = enrolled_worker("box-revoked")
    worker_revoke(worker_id=revoked.worker_id)

    names = []
    page = get(client, "workers?limit=2", viewer_headers).json()
    while True:
        names += [w["name"] for w in page["results"]]
        if page["next"] is None:
            break
        page = client.get(page["next"], headers=viewer_headers).json()
    assert names == ["box-0", "box-1", "box-2", "box-3", "box-4", "box-revoked"]

    assert [w["name"] for w in get(client, "workers?state=draining", viewer_headers).json()["results"]] == [
        "box-4"
    ]
    eu = get(client, "workers?label=zone=eu-1", viewer_headers).json()["results"]
    assert [w["name"] for w in eu] == ["box-1", "box-3"]
    assert all(w["liveSession"]["state"] == "online" for w in eu)
    assert get(client, "workers?label=zone=nowhere", viewer_headers).json()["results"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=sleeping", "state"),
        ("label=zone", "label"),
        ("label=Zone=EU", "label"),
        ("cursor=not-a-cursor", "cursor"),
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=ten", "limit"),
    ],
)
def test_bad_worker_list_input_names_the_field(client, viewer_headers, query, field):
    answer = get(client, f"workers?{query}", viewer_headers)
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        field,
    )


def test_worker_detail_shows_the_live_session_and_active_attempts(client, viewer_headers):
    worker = enrolled_worker("detail-box")
    session = register(worker, max_concurrent=3)
    body = get(client, f"workers/{worker.worker_id}", viewer_headers).json()
    live = body["liveSession"]
    assert (live["id"], live["generation"], live["maxConcurrentRuns"], live["capacityUsed"]) == (
        str(session.session_id),
        1,
        3,
        0,
    )
    assert 0 <= live["heartbeatAgeSeconds"] < 5 and live["capabilities"]["labels"] == {"zone": "eu-1"}
    assert body["activeAttempts"] == []
    missing = get(client, "workers/01900000-0000-7000-8000-000000000000", viewer_headers)
    assert (missing.status_code, missing.json()["code"]) == (404, "worker_not_found")
    assert get(client, "workers/not-a-uuid", viewer_headers).status_code == 404


def test_the_enrollment_token_is_shown_once_and_never_again(client, admin_headers, viewer_headers):
    created = client.post(
        OPS + "workers", {"name": "fresh"}, content_type="application/json", headers=admin_headers
    )
    worker_id = created.json()["id"]
    issued = client.post(
        OPS + f"workers/{worker_id}/enrollment-tokens",
        {"ttlSeconds": 600},
        content_type="application/json",
        headers=admin_headers,
    )
    assert issued.status_code == 201 and issued["Cache-Control"] == "no-store"
    token = issued.json()["token"]
    assert token in issued.json()["command"]
    for path in (f"workers/{worker_id}", "workers", f"audit?worker={worker_id}", "sessions"):
        assert token not in get(client, path, admin_headers).content.decode()
    too_short = client.post(
        OPS + f"workers/{worker_id}/enrollment-tokens",
        {"ttlSeconds": 5},
        content_type="application/json",
        headers=admin_headers,
    )
    assert (too_short.status_code, too_short.json()["field"]) == (400, "ttlSeconds")
    unknown = client.post(
        OPS + f"workers/{worker_id}/drain",
        {"now": True},
        content_type="application/json",
        headers=admin_headers,
    )
    assert (unknown.status_code, unknown.json()["field"]) == (400, "now")


def test_sessions_and_audit_are_readable_and_filtered(client, viewer_headers):
    worker = enrolled_worker("audited")
    first = register(worker)
    second = register(worker)
    worker_drain(worker_id=worker.worker_id, actor="someone", role="operator")
    sessions = get(client, f"sessions?worker={worker.worker_id}", viewer_headers).json()["results"]
    assert [(s["generation"], s["state"]) for s in sessions] == [(2, "draining"), (1, "fenced")]
    one = get(client, f"sessions/{first.session_id}", viewer_headers).json()
    assert one["capabilities"]["arch"] == "x86_64" and one["endReason"] == "superseded"
    assert get(client, "sessions?state=fenced", viewer_headers).json()["results"][0]["id"] == str(
        first.session_id
    )
    del second

    drained = get(client, "audit?actor=someone&action=worker.drained", viewer_headers).json()["results"]
    assert [(e["kind"], e["data"]["role"]) for e in drained] == [("worker.drained", "operator")]
    by_prefix = get(client, f"audit?worker={worker.worker_id}&action=session.", viewer_headers).json()[
        "results"
    ]
    assert {e["kind"] for e in by_prefix} >= {"session.registered", "session.replaced", "session.drained"}
    assert get(client, "audit?since=2999-01-01T00:00:00Z", viewer_headers).json()["results"] == []
    for query, field in (
        ("worker=nope", "worker"),
        ("since=yesterday", "since"),
        ("action=" + "x" * 49, "action"),
    ):
        answer = get(client, f"audit?{query}", viewer_headers)
        assert (answer.status_code, answer.json()["field"]) == (400, field), query
    assert get(client, "sessions?state=asleep", viewer_headers).json()["field"] == "state"


def _forged(query: str) -> str:
    """A cursor as DRF encodes one (base64 of its query string), with a position of our own."""
    return base64.b64encode(query.encode()).decode()


@pytest.mark.parametrize("endpoint", ["runs", "audit", "sessions", "workers", "tasks"])
@pytest.mark.parametrize("position", ["p=garbage", "r=1&p=x", "p=%00", "p=2020-13-45", "o=5&p=1e9999"])
def test_a_forged_cursor_position_is_refused_naming_the_cursor(client, viewer_headers, endpoint, position):
    """A cursor is opaque but not signed: one whose position is no value of the list's ordering
    (a number for the audit log, a UUID for runs, a time for sessions) is refused, not a 500."""
    answer = get(client, f"{endpoint}?cursor={_forged(position)}", viewer_headers)
    if answer.status_code == 200:  # a name-ordered list: any text is a position (but no NUL)
        assert endpoint in ("workers", "tasks") and position != "p=%00", answer.json()
        return
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        "cursor",
    )


@pytest.mark.parametrize("endpoint", ["runs", "audit", "workers"])
@pytest.mark.parametrize("query", ["\x00" * 3750, "garbage", "o=1&x=2", "p=1&p=2&q="])
def test_a_cursor_holding_what_no_cursor_holds_is_refused_not_read_as_the_first_page(
    client, viewer_headers, endpoint, query
):
    """A decodable cursor with keys DRF never writes (5,000 characters of ``A``, which decode to
    NULs; a word; a stray key) used to answer the first page as if no cursor had been sent."""
    answer = get(client, f"{endpoint}?cursor={_forged(query)}", viewer_headers)
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        "cursor",
    )


@pytest.mark.parametrize("endpoint", ["workers", "audit"])
def test_the_cursors_a_list_issues_are_taken_forwards_and_back(client, viewer_headers, endpoint):
    """Every ``next`` and ``previous`` link a list issues is accepted (the check above refuses
    only what DRF never writes): forwards to the end, then back page by page to the first."""
    for index in range(5):
        enrolled_worker(f"box-{index}")
    pages = [get(client, f"{endpoint}?limit=2", viewer_headers).json()]
    while pages[-1]["next"]:
        pages.append(client.get(pages[-1]["next"], headers=viewer_headers).json())
    assert len(pages) >= 3
    for later, earlier in zip(pages[:0:-1], pages[-2::-1], strict=True):
        back = client.get(later["previous"], headers=viewer_headers)
        assert back.status_code == 200 and back.json()["results"] == earlier["results"]


@pytest.mark.parametrize("method", ["put", "delete", "patch"])
@pytest.mark.parametrize("endpoint", ["workers", "runs", "audit"])
def test_a_method_a_list_has_no_handler_for_is_method_not_allowed(client, viewer_headers, method, endpoint):
    """405 with ``Allow`` (the view serves no such method), not a 403: no permission is involved."""
    answer = getattr(client, method)(OPS + endpoint, headers=viewer_headers)
    assert (answer.status_code, answer.json()["code"]) == (405, "method_not_allowed")
    assert "GET" in answer["Allow"]


def test_a_method_without_credentials_is_still_not_authenticated_first(client):
    answer = client.put(OPS + "workers")
    assert (answer.status_code, answer.json()["code"]) == (401, "not_authenticated")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("task=%00", "task"),
        ("state=running%00", "state"),
        ("label=zone%3Deu%00", "label"),
        ("x%00=1", "x\x00"),
    ],
)
def test_a_nul_in_a_query_parameter_is_refused_naming_it(client, viewer_headers, query, field):
    """PostgreSQL refuses text holding NUL (a 500 if it reached a query): refused first, on both stores."""
    endpoint = "workers" if query.startswith("label") else "runs"
    answer = get(client, f"{endpoint}?{query}", viewer_headers)
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        field,
    )
