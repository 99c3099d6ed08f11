"""Property-based HTTP tests: generated invalid snapshots and placements always get a 4xx naming
the field the pure function names, never a 5xx, and store nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement import spec
from protocol import capabilities as caps
from protocol import strictjson, wire
from protocol.errors import ProtocolError
from runs.models import Task, TaskRevision
from tests.helpers import SignedClient, enrolled_worker, register_body
from tests.placement.support import stored
from tests.protocol.strategies import JSON, invalid_placements, invalid_snapshots

pytestmark = pytest.mark.django_db

HTTP = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def worker_api(client, protocol_settings):
    protocol_settings(RATE_WORKER="100000/m")
    return SignedClient(client, enrolled_worker())


@HTTP
@given(case=invalid_snapshots())
def test_generated_invalid_snapshots_get_a_4xx_naming_the_field(worker_api, case):
    document, field, code = case
    before = stored()
    answer = worker_api.post(wire.SESSION_REGISTER, register_body(document))
    assert answer.json()["field"] == f"capabilities.{field}", answer.content
    if answer.json()["code"] == "json_too_deep":
        assert answer.status_code == 400  # nesting beyond the shape is refused while parsing, same field
    else:
        assert (answer.status_code, answer.json()["code"]) == (422, code)
    assert stored() == before


@HTTP
@given(value=JSON)
def test_arbitrary_json_capabilities_get_the_pure_functions_answer(worker_api, value):
    before = stored()
    answer = worker_api.post(wire.SESSION_REGISTER, register_body(value))
    try:
        caps.snapshot(value)
    except ProtocolError as error:
        assert answer.status_code == 422, answer.content
        expected = "capabilities" if error.field == "capabilities" else f"capabilities.{error.field}"
        assert (answer.json()["code"], answer.json()["field"]) == (error.code, expected)
        assert stored() == before
    else:
        assert answer.status_code == 201, answer.content


def task_body(placement) -> dict:
    return {
        "name": "t-gen",
        "executor": "shell",
        "command": "true",
        "timeoutSeconds": 30,
        "placement": placement,
    }


@HTTP
@given(case=invalid_placements())
def test_generated_invalid_placements_get_a_4xx_naming_the_field(ops, case):
    document, field = case
    before = stored()
    answer = ops.post("/api/v1/ops/tasks", strictjson.dumps(task_body(document)))
    assert answer.status_code == 422, answer.content
    assert (answer.json()["code"], answer.json()["field"]) == ("placement_invalid", f"placement.{field}")
    assert stored() == before


# null is refused by DRF itself (test_null_placement_is_refused_naming_it); every other value
# reaches the spec as it was sent — falsy ones included (test_falsy_non_object_placement_is_refused).
NON_NULL_JSON = JSON.filter(lambda value: value is not None)


@HTTP
@given(value=NON_NULL_JSON)
def test_arbitrary_json_placements_get_the_pure_functions_answer(ops, value):
    before = stored()
    answer = ops.post("/api/v1/ops/tasks", strictjson.dumps(task_body(value)))
    try:
        spec.normalise(value, executor="shell")
    except ProtocolError as error:
        assert answer.status_code == 422, answer.content
        expected = f"placement.{error.field}" if error.field else "placement"
        assert (answer.json()["code"], answer.json()["field"]) == (error.code, expected)
        assert stored() == before
    else:
        assert answer.status_code == 201, answer.content
        TaskRevision.objects.all().delete()  # let the next example reuse the task name
        Task.objects.all().delete()


def test_null_placement_is_refused_naming_it(ops):
    answer = ops.post("/api/v1/ops/tasks", strictjson.dumps(task_body(None)))
    assert (answer.status_code, answer.json()["field"]) == (400, "placement")
    assert Task.objects.count() == 0


@pytest.mark.parametrize("falsy", [[], 0, False, ""])
def test_falsy_non_object_placement_is_refused(ops, falsy):
    answer = ops.post("/api/v1/ops/tasks", strictjson.dumps(task_body(falsy)))
    assert answer.status_code == 422
    assert (answer.json()["code"], answer.json()["field"]) == ("placement_invalid", "placement")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(min_size=1, max_size=12))
def test_arbitrary_candidate_cursors_are_a_4xx_never_a_5xx(ops, cursor):
    answer = ops.get("/api/v1/ops/runs/0190f0f0-0000-7000-8000-000000000000/candidates", after=cursor)
    assert answer.status_code in (400, 404), answer.content
    assert answer.json()["field"] in ("after", None)
