"""Schema-driven fuzzing of both APIs with schemathesis, against the generated OpenAPI schema.

Every operation of the schema served at /api/v1/schema is fuzzed in-process (WSGI), with
positive (schema-valid) and negative (schema-violating) cases, under each way a caller can
come: worker endpoints unsigned and RFC 9421-signed with an enrolled worker's key; operator
endpoints anonymous, with a staff token, and signed with a worker key (always refused). Each
answer must be no 5xx, a status the schema documents, JSON, and a body matching the documented
schema; a signed schema-violating request must never be accepted.

``test_run_answers_match_the_schema`` additionally checks real run answers (nullable run and
attempt fields included) against the schema, since random inputs rarely reach an existing run.

The number of examples per operation and mode is bounded (``QINGLONG_FUZZ_EXAMPLES``, default
12) and the run is derandomised so that `make test` is reproducible; set
``QINGLONG_FUZZ_SEED`` to explore other inputs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlencode

import pytest
import schemathesis
import yaml
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core import NOT_SET
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from protocol.signing import sign_request
from tests.helpers import api_token, enqueue, enrolled_worker, make_revision, operator_user, register

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("QINGLONG_FUZZ_EXAMPLES", "12"))
SEED = os.environ.get("QINGLONG_FUZZ_SEED")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every operation in the committed schema (test_openapi keeps it current)."""
    document = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
    return [(method.upper(), path) for path, item in document["paths"].items() for method in item]


OPERATIONS = _operations()
WORKER_MODES = ("unsigned", "signed")
OPERATOR_MODES = ("anonymous", "staff", "worker-signed")
CASES = [
    pytest.param(method, path, mode, id=f"{mode}-{method}-{path.removeprefix('/api/v1/')}")
    for method, path in OPERATIONS
    for mode in (WORKER_MODES if path.startswith("/api/v1/worker/") else OPERATOR_MODES)
]


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    # Fetching the schema is a WSGI request, whose request_started signal touches the database
    # connection; a module-scoped fixture runs outside any test's database access.
    with django_db_blocker.unblock():
        return schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", get_wsgi_application())


@pytest.fixture
def in_test_transaction():
    """The WSGI handler closes the database connection around each request; inside a test's
    transaction that would end the test's world, so (as Django's test client does) it doesn't."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def callers(protocol_settings, in_test_transaction):
    """An enrolled worker with a live session, a staff token and a queued run to read and
    cancel; rate limits out of the way."""
    protocol_settings(RATE_WORKER="100000/m", RATE_ENROLL="100000/m", RATE_AUTH_FAILURES="100000/m")
    worker = enrolled_worker()
    session = register(worker)
    staff = operator_user("fuzz-operator", superuser=True)
    revision = make_revision(name="fuzzed-task")
    run = enqueue(revision)
    ids = {
        "workerId": str(worker.worker_id),
        "sessionId": str(session.session_id),
        "generation": session.generation,
        "run_id": str(run.pk),
        "revision_id": str(revision.pk),
        "name": "fuzzed-task",
    }
    return worker, api_token(staff), ids


def _bind(case, ids: dict) -> None:
    """Point generated ids at real rows (the caller's own worker and live session, a real run,
    revision and task), so that cases get past binding and lookups into the services."""
    for name in ("run_id", "revision_id", "name"):
        if case.path_parameters and name in case.path_parameters:
            case.path_parameters[name] = ids[name]
    if isinstance(case.body, dict):
        for key in ("workerId", "sessionId", "generation"):
            if key in case.body:
                case.body[key] = ids[key]


def _target(case) -> str:
    path = case.formatted_path
    if case.query:
        return f"{path}?{urlencode(case.query, doseq=True)}"
    return path


def _payload(case) -> bytes:
    """The body bytes as schemathesis would send them (raw bytes stay raw: not all input is JSON)."""
    if case.body is NOT_SET:
        return b""
    if isinstance(case.body, bytes):
        return case.body
    return json.dumps(case.body, default=lambda value: value.decode("latin-1")).encode("utf-8")


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_fuzz_operation(schema, callers, method, path, mode):
    worker, staff_token, ids = callers
    operation = schema[path][method]
    checks = CHECKS
    strategy = operation.as_strategy(generation_mode=GenerationMode.POSITIVE) | operation.as_strategy(
        generation_mode=GenerationMode.NEGATIVE
    )

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=SEED is None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, bind=st.booleans())
    def fuzz(case, bind):
        if bind and case.meta.generation.mode is GenerationMode.POSITIVE:
            _bind(case, ids)
        payload = _payload(case)
        headers: dict[str, str] = {}
        if mode == "staff":
            headers["Authorization"] = f"Token {staff_token}"
        if mode in ("signed", "worker-signed"):
            headers.update(
                sign_request(
                    method=method,
                    path=_target(case),
                    body=payload,
                    key_id=worker.credential_id,
                    private_key=worker.key,
                )
            )
        response = case.call(headers=headers, data=payload, environ_base={"REMOTE_ADDR": "192.0.2.7"})
        case.validate_response(response, checks=checks)
        if mode == "worker-signed":  # refused, unless no route matched the generated path at all
            answer = response.json()
            assert (response.status_code, answer["code"]) in (
                (403, "worker_credential_forbidden"),
                (404, "not_found"),
                (413, "body_too_large"),  # the size limit runs before any authenticator
            ) or (response.status_code, answer["message"]) == (
                400,  # as does the NUL refusal (api.middleware.NulRefusalMiddleware)
                "must not contain a NUL character",
            ), answer
        if mode == "signed" and case.meta.generation.mode is GenerationMode.NEGATIVE:
            assert response.status_code >= 400, f"accepted schema-violating input: {payload[:300]!r}"

    if SEED is not None:
        fuzz = seed(int(SEED))(fuzz)
    fuzz()


def test_run_answers_match_the_schema(schema, callers):
    _, staff_token, ids = callers
    headers = {"Authorization": f"Token {staff_token}"}
    for method, path, path_parameters in (
        ("GET", "/api/v1/ops/runs", None),
        ("GET", "/api/v1/ops/runs/{run_id}", {"run_id": ids["run_id"]}),
    ):
        case = schema[path][method].Case(path_parameters=path_parameters)
        response = case.call(headers=headers, environ_base={"REMOTE_ADDR": "192.0.2.7"})
        assert response.status_code == 200
        case.validate_response(response, checks=[response_schema_conformance])
