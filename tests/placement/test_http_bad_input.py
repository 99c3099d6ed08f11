"""Bad input over HTTP: each answer is a 4xx naming the field, and nothing is stored.

Capability snapshots go through the signed worker register endpoint; placements through the
operator API's task creation. "Nothing stored" means no session, task, revision or event row.
"""

from __future__ import annotations

import json

import pytest

from protocol import capabilities as caps
from protocol import strictjson, wire
from runs.models import TaskRevision
from tests.helpers import BASE_SNAPSHOT, SignedClient, enrolled_worker, register_body
from tests.placement.support import stored
from tests.protocol.strategies import snapshot_of_size
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker_api(client):
    worker = enrolled_worker()
    return SignedClient(client, worker)


def raw_register(capabilities_text: str) -> bytes:
    """A register body whose capabilities are the given raw JSON text (to carry what json.dumps cannot)."""
    envelope = json.dumps(register_body("__CAPS__"))
    return envelope.replace('"__CAPS__"', capabilities_text).encode("utf-8")


def caps_text(**replace: str) -> str:
    """BASE_SNAPSHOT as JSON text with some values replaced by raw JSON text."""
    parts = [f'"{key}": {replace.get(key, json.dumps(value))}' for key, value in BASE_SNAPSHOT.items()]
    return "{" + ", ".join(parts) + "}"


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        (raw_register(caps_text(memoryMiB="NaN")), 400, "json_number_out_of_range", "capabilities.memoryMiB"),
        (
            raw_register(caps_text(diskMiB="Infinity")),
            400,
            "json_number_out_of_range",
            "capabilities.diskMiB",
        ),
        (raw_register(caps_text(diskMiB="1e400")), 400, "json_number_out_of_range", "capabilities.diskMiB"),
        (
            raw_register(caps_text(cpuCount="123456789012345678901234")),
            400,
            "json_number_out_of_range",
            "capabilities.cpuCount",
        ),
        (
            raw_register(caps_text(labels='{"zone": "eu-1", "zone": "eu-2"}')),
            400,
            "json_duplicate_key",
            "capabilities.labels.zone",
        ),
        (
            raw_register(caps_text(labels='{"zone": "\\ud800"}')),
            400,
            "json_invalid_string",
            "capabilities.labels.zone",
        ),
        (
            raw_register(caps_text(features='["\\udfff"]')),
            400,
            "json_invalid_string",
            "capabilities.features[0]",
        ),
        # 1,000 levels: refused at the container that crosses the endpoint's depth
        # (5: the shape needs no more).
        (
            raw_register(caps_text(labels='{"zone": ' + "[" * 1000 + "]" * 1000 + "}")),
            400,
            "json_too_deep",
            "capabilities.labels.zone[0][0]",
        ),
        (
            raw_register(caps_text(executors='["sh\x01ell"]')),
            400,
            "json_invalid_string",
            "capabilities.executors[0]",
        ),
        (
            raw_register(caps_text(executors='["sh\\u0000ell"]')),
            422,
            "capabilities_invalid",
            "capabilities.executors[0]",
        ),
        (
            raw_register(caps_text(executors='["shell", "python", "shell"]')),
            422,
            "capabilities_invalid",
            "capabilities.executors[2]",
        ),
        (raw_register(caps_text(cpuCount="5000")), 422, "capabilities_invalid", "capabilities.cpuCount"),
        (raw_register(caps_text(memoryMiB="-1")), 422, "capabilities_invalid", "capabilities.memoryMiB"),
        (raw_register(caps_text(memoryMiB="2048.0")), 422, "capabilities_invalid", "capabilities.memoryMiB"),
        (
            raw_register(caps_text(labels=json.dumps({f"k{i}": "v" for i in range(65)}))),
            422,
            "capabilities_invalid",
            "capabilities.labels",
        ),
        (
            raw_register(caps_text(labels='{"Zone": "eu-1"}')),
            422,
            "capabilities_invalid",
            "capabilities.labels.Zone",
        ),
        (
            raw_register(caps_text(runtimes='[{"name": "python", "version": "3.11"}]')),
            422,
            "capabilities_invalid",
            "capabilities.runtimes[0].version",
        ),
        (raw_register(caps_text(arch='"sparc64"')), 422, "capabilities_invalid", "capabilities.arch"),
    ],
)
def test_bad_snapshot_bytes_are_refused_naming_the_field_and_nothing_is_stored(
    worker_api, body, status, code, field
):
    before = stored()
    answer = worker_api.post(wire.SESSION_REGISTER, body)
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (status, code, field), (
        answer.json()
    )
    assert stored() == before


@pytest.mark.parametrize(
    ("capabilities", "field"),
    [
        ({**BASE_SNAPSHOT, "extra": True}, "capabilities.extra"),
        (
            {
                **BASE_SNAPSHOT,
                "runtimes": [{"name": "python", "version": "3.11.7", "path": "/usr/bin/python3"}],
            },
            "capabilities.runtimes[0].path",
        ),
        (
            {
                **BASE_SNAPSHOT,
                "gpus": [{"vendor": "nvidia", "model": "A100", "memoryMiB": 1, "features": [], "uuid": "x"}],
            },
            "capabilities.gpus[0].uuid",
        ),
    ],
)
def test_unknown_snapshot_fields_are_refused_at_every_level(worker_api, capabilities, field):
    before = stored()
    answer = worker_api.post(wire.SESSION_REGISTER, register_body(capabilities))
    assert answer.status_code == 422
    assert answer.json() == {"code": "capabilities_invalid", "message": "unknown field", "field": field}
    assert stored() == before


def test_unknown_envelope_field_is_refused(worker_api):
    before = stored()
    answer = worker_api.post(wire.SESSION_REGISTER, register_body(BASE_SNAPSHOT, capabilitiesSha256="00"))
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        "capabilitiesSha256",
    )
    assert stored() == before


def test_snapshot_one_byte_over_16_kib_is_refused_and_exactly_16_kib_is_taken(worker_api):
    before = stored()
    over = snapshot_of_size(caps.MAX_SNAPSHOT_BYTES + 1)
    body = strictjson.dumps(register_body(over))
    assert len(body) <= wire.BODY_LIMITS[wire.SESSION_REGISTER]  # the body limit is not what refuses it
    answer = worker_api.post(wire.SESSION_REGISTER, body)
    assert answer.status_code == 422
    assert (answer.json()["code"], answer.json()["field"]) == ("capabilities_too_large", "capabilities")
    assert stored() == before

    fits = worker_api.post(wire.SESSION_REGISTER, register_body(snapshot_of_size(caps.MAX_SNAPSHOT_BYTES)))
    assert fits.status_code == 201, fits.json()
    assert len(WorkerSession.objects.get().capabilities.encode()) == caps.MAX_SNAPSHOT_BYTES


# --- placements through the operator API ---------------------------------------------------------


def task_body(placement_text: str) -> bytes:
    envelope = json.dumps(
        {
            "name": "t-bad",
            "executor": "shell",
            "command": "true",
            "timeoutSeconds": 30,
            "placement": "__PLACEMENT__",
        }
    )
    return envelope.replace('"__PLACEMENT__"', placement_text).encode("utf-8")


@pytest.mark.parametrize(
    ("placement", "status", "code", "field"),
    [
        (
            '{"required": {"runtimes": {"python": ">=banana"}}}',
            422,
            "placement_invalid",
            "placement.required.runtimes.python",
        ),
        (
            '{"required": {"runtimes": {"python": "3.x ||"}}}',
            422,
            "placement_invalid",
            "placement.required.runtimes.python",
        ),
        ('{"requird": {}}', 422, "placement_invalid", "placement.requird"),
        ('{"required": {"cpuCount": 2}}', 422, "placement_invalid", "placement.required.cpuCount"),
        (
            '{"required": {"gpu": {"model": "A100"}}}',
            422,
            "placement_invalid",
            "placement.required.gpu.model",
        ),
        ('{"preferred": {"weights": {}}}', 422, "placement_invalid", "placement.preferred.weights"),
        (
            '{"preferred": {"labels": [{"key": "zone", "value": "eu", "weight": 5, "boost": 1}]}}',
            422,
            "placement_invalid",
            "placement.preferred.labels[0].boost",
        ),
        (
            '{"required": {"labels": ' + json.dumps({f"k{i}": "v" for i in range(65)}) + "}}",
            422,
            "placement_invalid",
            "placement.required.labels",
        ),
        (
            '{"preferred": {"labels": [{"key": "zone", "value": "eu", "weight": 500}]}}',
            422,
            "placement_invalid",
            "placement.preferred.labels[0].weight",
        ),
        ('"anywhere"', 422, "placement_invalid", "placement"),
        (
            '{"required": {"minMemoryMiB": NaN}}',
            400,
            "json_number_out_of_range",
            "placement.required.minMemoryMiB",
        ),
        (
            '{"required": {"minDiskMiB": 1e400}}',
            400,
            "json_number_out_of_range",
            "placement.required.minDiskMiB",
        ),
        ('{"required": {}, "required": {}}', 400, "json_duplicate_key", "placement.required"),
        (
            '{"required": {"labels": {"zone": "\\udc00"}}}',
            400,
            "json_invalid_string",
            "placement.required.labels.zone",
        ),
        (
            '{"required": {"labels": {"zone": ' + "[" * 1000 + "]" * 1000 + "}}}",
            400,
            "json_too_deep",
            "placement.required.labels.zone[0][0][0][0]",
        ),
    ],
)
def test_bad_placements_are_refused_naming_the_field_and_nothing_is_stored(
    ops, placement, status, code, field
):
    before = stored()
    answer = ops.post("/api/v1/ops/tasks", task_body(placement))
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (status, code, field), (
        answer.json()
    )
    assert stored() == before


def test_a_valid_placement_is_stored_normalised_once(ops):
    answer = ops.post(
        "/api/v1/ops/tasks", task_body('{"required": {"arch": ["amd64"], "runtimes": {"python": ">=3.9"}}}')
    )
    assert answer.status_code == 201, answer.json()
    revision = TaskRevision.objects.get()
    assert json.loads(revision.placement)["required"]["arch"] == ["x86_64"]
    assert answer.json()["placementSha256"] == revision.placement_sha256
