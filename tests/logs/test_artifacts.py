"""Artifacts (docs/logs.md, Artifacts): declared globs, limits named in the refusal, SHA-256
verified, fenced by the run lease like every worker write, downloadable by operators."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest

from actions.artifacts import Part, artifact_upload
from actions.logs import log_compact, sweep_output_retention
from core.db import db_now
from core.errors import DomainError
from logs.models import Artifact, ArtifactPart, AttemptLog
from runs.revisions import OutputSpec
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, start
from tests.logs.flows import append, output_rows, upload

pytestmark = pytest.mark.django_db

DECLARED = OutputSpec(
    paths=("out/*.txt", "report.json"), max_files=2, max_file_bytes=200_000, max_total_bytes=300_000
)


def running(output=DECLARED):
    session = register(enrolled_worker())
    run = enqueue(make_revision(output=output))
    return start(claim_one(session)), run


def test_an_artifact_uploaded_in_parts_is_stored_with_its_checksum(output_dir):
    held, run = running()
    content = bytes(range(256)) * 700  # 179,200 bytes: six parts
    result = upload(held, "out/data.txt", content)
    assert result.status == "stored"
    artifact = Artifact.objects.get(pk=result.artifact_id)
    assert (artifact.size, artifact.sha256, artifact.state) == (
        len(content),
        hashlib.sha256(content).hexdigest(),
        "stored",
    )
    assert (output_dir / artifact.storage_name).read_bytes() == content
    assert not ArtifactPart.objects.exists()
    assert upload(held, "out/data.txt", content).status == "idempotent"


def test_the_execution_spec_declares_the_outputs():
    held, _ = running()
    assert held.execution["outputs"] == {
        "paths": ["out/*.txt", "report.json"],
        "maxFiles": 2,
        "maxFileBytes": 200_000,
        "maxTotalBytes": 300_000,
    }


@pytest.mark.parametrize(
    "name, size, field",
    [("out/big.txt", 200_001, "maxFileBytes")],
)
def test_a_file_over_its_limit_is_refused_naming_the_limit(name, size, field):
    held, _ = running()
    before = output_rows()
    with pytest.raises(DomainError) as refused:
        upload(held, name, b"z" * size)
    assert (refused.value.code, refused.value.field, refused.value.details) == (
        "artifact_limit_exceeded",
        field,
        {"limit": 200_000},
    )
    assert output_rows() == before


def test_the_file_count_and_total_are_limits_too():
    held, _ = running()
    upload(held, "out/a.txt", b"a" * 150_000)
    with pytest.raises(DomainError) as total:
        upload(held, "out/b.txt", b"b" * 150_001)
    assert (total.value.field, total.value.details) == ("maxTotalBytes", {"limit": 300_000})
    upload(held, "out/b.txt", b"b")
    with pytest.raises(DomainError) as count:
        upload(held, "report.json", b"{}")
    assert (count.value.code, count.value.field) == ("artifact_limit_exceeded", "maxFiles")


def test_an_undeclared_name_and_a_wrong_checksum_are_refused():
    held, _ = running()
    with pytest.raises(DomainError) as undeclared:
        upload(held, "secret/key.pem", b"x")
    assert (undeclared.value.code, undeclared.value.field) == ("artifact_not_declared", "name")
    with pytest.raises(DomainError) as mismatch:
        upload(held, "report.json", b"{}", sha256="0" * 64)
    assert mismatch.value.code == "artifact_checksum_mismatch"
    assert not Artifact.objects.filter(name="report.json").exists()  # nothing of it was stored
    assert upload(held, "report.json", b"{}").status == "stored"


def test_an_artifact_for_a_settled_lease_or_with_a_wrong_token_is_refused():
    held, _ = running()
    with pytest.raises(DomainError) as forged:
        upload(held, "report.json", b"{}", lease_token="B" * 43)
    assert forged.value.code == "lease_token_mismatch"
    complete(held)
    before = output_rows()
    with pytest.raises(DomainError) as settled:
        upload(held, "report.json", b"{}")
    assert settled.value.code == "lease_completed"
    assert output_rows() == before


def test_parts_arrive_in_order():
    held, _ = running()
    digest = hashlib.sha256(b"abcd").hexdigest()
    with pytest.raises(DomainError) as refused:
        artifact_upload(
            **held.fence(), part=Part(name="report.json", size=4, sha256=digest, offset=2, data=b"cd")
        )
    assert (refused.value.code, refused.value.field, refused.value.details) == (
        "validation_failed",
        "offset",
        {"expectedOffset": 0},
    )


def test_the_retention_sweep_deletes_expired_logs_and_artifacts(
    output_dir, django_capture_on_commit_callbacks
):
    held, _ = running()
    append(held, 1, b"kept for a while\n")
    stored = upload(held, "report.json", b"{}")
    complete(held)
    assert log_compact(attempt_id=held.attempt_id)
    log = AttemptLog.objects.get(pk=held.attempt_id)
    artifact = Artifact.objects.get(pk=stored.artifact_id)
    files = [output_dir / log.object_name, output_dir / artifact.storage_name]
    assert all(path.exists() for path in files)
    assert sweep_output_retention() == 0  # not expired yet
    past = db_now() - timedelta(seconds=1)
    AttemptLog.objects.filter(pk=held.attempt_id).update(expires_at=past)
    Artifact.objects.filter(pk=artifact.pk).update(expires_at=past)
    with django_capture_on_commit_callbacks(execute=True):  # the objects go once the rows' delete commits
        assert sweep_output_retention() == 2
    # The rows stay, emptied, so reads answer log_expired / artifact_expired.
    assert AttemptLog.objects.get(pk=held.attempt_id).object_name == ""
    assert Artifact.objects.get(pk=artifact.pk).storage_name == ""
    assert not any(path.exists() for path in files)
    assert not files[1].parent.exists()  # the attempt's artifact directory went with its last file
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_output_retention() == 0  # expired once
