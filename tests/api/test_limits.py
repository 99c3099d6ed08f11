"""Message limits (ADR-0012 §1, docs/transport.md §6): body size per endpoint before anything parses
or authenticates (413), strict JSON (depth, duplicate keys), rate limits per principal (429)."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from api import parsers
from protocol import strictjson, wire
from protocol.signing import sign_request
from tests.helpers import SignedClient, enrolled_worker, heartbeat, register

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client):
    worker = enrolled_worker()
    return SignedClient(client, worker), register(worker)


def test_an_oversized_body_is_refused_before_authentication_and_parsing(client, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(parsers.StrictJSONParser, "parse", never)
    oversized = b"{" + b" " * wire.DEFAULT_BODY_LIMIT + b"}"  # not even valid JSON: it is never read
    with CaptureQueriesContext(connection) as queries:
        answer = client.generic("POST", wire.SESSION_HEARTBEAT, oversized, content_type="application/json")
    assert answer.status_code == 413
    assert answer.json() == {
        "code": "body_too_large",
        "field": None,
        "details": {"limitBytes": 4096},
        "message": f"the body is {len(oversized)} bytes; this endpoint takes at most 4096",
    }
    assert len(queries) == 0


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        (wire.SESSION_HEARTBEAT, 4 * 1024),
        (wire.SESSION_REGISTER, 20 * 1024),
        (wire.LEASE_COMPLETE, 100 * 1024),
        (wire.CLAIM, 4 * 1024),
        (wire.ENROLL, 4 * 1024),
        (wire.ROTATE_KEY, 4 * 1024),
        ("/api/v1/ops/tasks", 96 * 1024),
    ],
)
def test_each_endpoint_has_its_own_limit(api, path, limit):
    signed, _ = api
    at_limit = signed.post(path, b" " * limit)
    assert at_limit.status_code != 413, at_limit.json()
    over = signed.post(path, b" " * (limit + 1))
    assert (over.status_code, over.json()["details"]["limitBytes"]) == (413, limit)


def test_a_content_length_that_is_not_a_number_is_refused(client):
    answer = client.generic(
        "POST", wire.SESSION_HEARTBEAT, b"{}", content_type="application/json", CONTENT_LENGTH="12abc"
    )
    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("content_length_invalid", "Content-Length")
    negative = client.generic(
        "POST", wire.SESSION_HEARTBEAT, b"{}", content_type="application/json", CONTENT_LENGTH="-1"
    )
    assert negative.json()["code"] == "content_length_invalid"


def test_json_nested_deeper_than_the_endpoint_allows_is_refused(api):
    signed, session = api
    nested = heartbeat(session, availableSlots=[[[[[1]]]]])
    answer = signed.post(wire.SESSION_HEARTBEAT, nested)
    assert (answer.status_code, answer.json()["code"]) == (400, "json_too_deep")
    bomb = signed.post(wire.SESSION_HEARTBEAT, b"[" * 2000 + b"]" * 2000)
    assert (bomb.status_code, bomb.json()["code"]) == (400, "json_too_deep")


def test_a_duplicate_key_is_refused_naming_where(api):
    signed, session = api
    raw = strictjson.dumps(heartbeat(session))[:-1] + b',"availableSlots":0}'
    answer = signed.post(wire.SESSION_HEARTBEAT, raw)
    assert (answer.status_code, answer.json()["code"]) == (400, "json_duplicate_key")
    nested = b'{"token":"t","publicKey":{"a":1,"a":2}}'
    answer = signed.client.post(wire.ENROLL, nested, content_type="application/json")
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "json_duplicate_key",
        "publicKey.a",  # the repeated key itself, inside the object that holds it
    )


@pytest.mark.parametrize("raw", [b'{"availableSlots": NaN}', b'{"a": 1e999}', b'{"a": "\\ud800"}', b"\xff"])
def test_non_json_numbers_surrogates_and_bad_utf8_are_refused(api, raw):
    signed, _ = api
    answer = signed.post(wire.SESSION_HEARTBEAT, raw)
    assert answer.status_code == 400
    assert answer.json()["code"] in {"json_number_out_of_range", "json_invalid_string", "json_malformed"}


def test_a_worker_is_rate_limited_with_retry_after_and_others_are_not(client, protocol_settings):
    protocol_settings(RATE_WORKER="3/m")
    busy, calm = enrolled_worker(), enrolled_worker()
    busy_session, calm_session = register(busy), register(calm)
    api = SignedClient(client, busy)
    for _ in range(3):
        assert api.post(wire.SESSION_HEARTBEAT, heartbeat(busy_session)).status_code == 200
    limited = api.post(wire.SESSION_HEARTBEAT, heartbeat(busy_session))
    assert (limited.status_code, limited.json()["code"]) == (429, "rate_limited")
    assert 1 <= int(limited["Retry-After"]) <= 60
    assert SignedClient(client, calm).post(wire.SESSION_HEARTBEAT, heartbeat(calm_session)).status_code == 200


def test_unknown_api_paths_answer_the_json_error_body(client):
    answer = client.post("/api/v1/worker/nothing-here", {}, content_type="application/json")
    assert answer.status_code == 404
    assert answer.json() == {"code": "not_found", "message": "no such endpoint", "field": None}
    assert client.get("/admin/nothing-here/").status_code in (302, 404)  # the admin keeps its own pages


def test_worker_endpoints_take_only_post(api):
    signed, _ = api
    unsigned = signed.client.get(wire.SESSION_HEARTBEAT)
    assert (unsigned.status_code, unsigned.json()["code"]) == (401, "signature_missing")

    headers = sign_request(
        method="GET",
        path=wire.SESSION_HEARTBEAT,
        body=b"",
        key_id=signed.worker.credential_id,
        private_key=signed.worker.key,
    )
    answer = signed.client.get(wire.SESSION_HEARTBEAT, headers=headers)
    assert (answer.status_code, answer.json()["code"]) == (405, "method_not_allowed")


@pytest.mark.parametrize("path", [wire.SESSION_HEARTBEAT, "/api/v1/ops/runs", "/api/v1/nowhere"])
def test_a_host_outside_allowed_hosts_gets_the_json_error_naming_the_header(client, path):
    reaching_the_log = RootRecords()  # what the configured root handlers see
    logging.getLogger().addHandler(reaching_the_log)
    try:
        answer = client.post(path, b"{}", content_type="application/json", headers={"host": "evil.example"})
    finally:
        logging.getLogger().removeHandler(reaching_the_log)
    assert answer.status_code == 400 and answer["Content-Type"] == "application/json"
    assert (answer.json()["code"], answer.json()["field"]) == ("host_not_allowed", "Host")
    # one warning line (and the access line), no ERROR with a traceback anyone could flood the log with
    assert [(r.name, r.levelno, r.exc_info) for r in reaching_the_log.records] == [
        ("api", logging.WARNING, None),
        ("qinglong.access", logging.INFO, None),
    ]


class RootRecords(logging.Handler):
    """Collects the records that propagate to the root logger (pytest's own capture handlers
    sit on every logger, so caplog would also show records the configuration drops)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_admin_keeps_djangos_page_for_a_disallowed_host(client):
    answer = client.get("/admin/", headers={"host": "evil.example"})
    assert answer.status_code == 400 and not answer["Content-Type"].startswith("application/json")
