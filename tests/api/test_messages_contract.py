"""The agent's message shapes (protocol.messages) carry exactly the keys of the server's DRF
serializers, for every worker endpoint: the same keys, and every key the server requires is
required of the agent too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rest_framework import serializers

from api.leases import serializers as lease_s
from api.logs import serializers as log_s
from api.workers import serializers as worker_s
from leases.offers import execution_spec
from protocol import messages as m
from protocol import wire

#: endpoint -> (request serializer, answer serializer), as the views declare them.
SERIALIZERS = {
    wire.ENROLL: (worker_s.EnrollSerializer, worker_s.EnrollOutSerializer),
    wire.ROTATE_KEY: (worker_s.RotateSerializer, worker_s.RotateOutSerializer),
    wire.SESSION_REGISTER: (worker_s.RegisterSerializer, worker_s.SessionOutSerializer),
    wire.SESSION_HEARTBEAT: (worker_s.HeartbeatSerializer, worker_s.SessionOutSerializer),
    wire.SESSION_DRAIN: (worker_s.TransitionSerializer, worker_s.SessionOutSerializer),
    wire.SESSION_OFFLINE: (worker_s.TransitionSerializer, worker_s.SessionOutSerializer),
    wire.CLAIM: (lease_s.ClaimSerializer, lease_s.ClaimOutSerializer),
    wire.LEASE_STARTING: (lease_s.AckSerializer, lease_s.AckOutSerializer),
    wire.LEASE_RUNNING: (lease_s.RunningAckSerializer, lease_s.AckOutSerializer),
    wire.LEASE_START_FAILED: (lease_s.StartFailedSerializer, lease_s.AckOutSerializer),
    wire.LEASE_RENEW: (lease_s.VersionedLeaseSerializer, lease_s.AckOutSerializer),
    wire.LEASE_RELEASE: (lease_s.VersionedLeaseSerializer, lease_s.AckOutSerializer),
    wire.LEASE_COMPLETE: (lease_s.CompleteSerializer, lease_s.CompleteOutSerializer),
    wire.LOG_APPEND: (log_s.LogChunkSerializer, log_s.LogChunkOutSerializer),
    wire.ARTIFACT_UPLOAD: (log_s.ArtifactPartSerializer, log_s.ArtifactPartOutSerializer),
}


def _fields(serializer: serializers.BaseSerializer) -> dict[str, serializers.Field]:
    return dict(serializer.fields)


def _nested(field: serializers.Field) -> serializers.BaseSerializer | None:
    if isinstance(field, serializers.ListSerializer):
        return field.child
    if isinstance(field, serializers.Serializer):
        return field
    return None


def assert_same_shape(
    message: type, serializer: serializers.BaseSerializer, where: str, *, requests: bool
) -> None:
    fields = _fields(serializer)
    assert set(message.__annotations__) == set(fields), where
    if requests:
        server_required = {name for name, field in fields.items() if field.required}
        assert server_required <= message.__required_keys__, (
            where,
            sorted(server_required - message.__required_keys__),
        )
    for name, field in fields.items():
        nested = _nested(field)
        if nested is not None:
            inner = message.__annotations__[name]
            inner = getattr(inner, "__args__", (inner,))[0]  # list[Offer] -> Offer
            assert_same_shape(inner, nested, f"{where}.{name}", requests=requests)


def test_every_endpoint_has_a_request_and_an_answer_shape():
    assert set(m.REQUESTS) == set(m.ANSWERS) == set(SERIALIZERS)


@pytest.mark.parametrize("path", sorted(SERIALIZERS))
def test_request_keys_are_the_serializer_fields(path):
    assert_same_shape(m.REQUESTS[path], SERIALIZERS[path][0](), path, requests=True)


@pytest.mark.parametrize("path", sorted(SERIALIZERS))
def test_answer_keys_are_the_serializer_fields(path):
    assert_same_shape(m.ANSWERS[path], SERIALIZERS[path][1](), path, requests=False)


def test_the_execution_spec_keys_are_what_a_claim_hands_out():
    revision = SimpleNamespace(
        pk=1,
        number=1,
        executor="shell",
        command="true",
        env={"TOKEN": "s3cret-value"},
        timeout_seconds=5,
        spec_sha256="0" * 64,
        secret_env=["TOKEN"],
        output_paths=["out/*"],
        artifact_max_files=1,
        artifact_max_file_bytes=2,
        artifact_max_total_bytes=3,
        effective_lost_after_seconds=0,
    )
    run = SimpleNamespace(pk=2, task_id=3, revision=revision)
    spec = execution_spec(run, SimpleNamespace(pk=4, number=1))
    assert set(spec) == set(m.ExecutionSpec.__annotations__)
    assert set(spec["outputs"]) == set(m.OutputsSpec.__annotations__)
    revision.output_paths = []  # nothing declared: no outputs key (and the spec digest of old revisions)
    revision.secret_env = []  # no secrets: no secretEnv key
    # lostAfterSeconds is always sent by this server; NotRequired for the agent (an older one sends none)
    assert set(execution_spec(run, SimpleNamespace(pk=4, number=1))) == m.ExecutionSpec.__required_keys__ | {
        "lostAfterSeconds"
    }
