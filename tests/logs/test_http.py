"""Job output over HTTP: the signed worker endpoints (named-field 400s, body limits, lease
refusals, replay) and the operator endpoints (plain-text log with ``after``/``stream``/
``attempt``, artifact list and download, permissions)."""

from __future__ import annotations

import base64
import hashlib
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from actions.logs import log_compact, sweep_output_retention
from actions.runs import sweep_due_retries
from actions.sessions.shutdown import session_operator_offline
from core.db import db_now
from logs.models import Artifact, AttemptLog, LogChunk
from protocol import wire
from runs.revisions import OutputSpec
from tests.helpers import (
    OfferTicket,
    SignedClient,
    enqueue,
    enrolled_worker,
    make_revision,
    operator_headers,
    refused,
    register,
)
from tests.leases.flows import claim_one, complete, make_retry_due, start
from tests.logs.flows import append, output_rows, upload

pytestmark = pytest.mark.django_db


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture
def started(client):
    """A running attempt claimed and ACKed over signed HTTP: (api, session, run, fence)."""
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(make_revision(output=OutputSpec(paths=("*.bin",), max_file_bytes=100_000)))
    api = SignedClient(client, worker)
    ticket = OfferTicket()
    offer = api.post(
        wire.CLAIM,
        {**session.fence(), "offers": [{"offerId": str(ticket.offer_id), "leaseToken": ticket.token}]},
    ).json()["offers"][0]
    lease = offer["lease"]
    fence = {
        **session.fence(),
        "attemptId": lease["attemptId"],
        "leaseGeneration": lease["leaseGeneration"],
        "leaseToken": ticket.token,
    }
    ack = {**fence, "offerId": str(ticket.offer_id), "leaseVersion": 0}
    assert api.post(wire.LEASE_STARTING, ack).status_code == 200
    running = {**ack, "pid": 4242, "pgid": 4242, "executorHandle": "pid=4242"}
    assert api.post(wire.LEASE_RUNNING, running).status_code == 200
    return api, session, run, fence


def chunk(fence, seq, *segments):
    return {
        **fence,
        "seq": seq,
        "segments": [{"stream": s, "offset": o, "content": b64(d)} for s, o, d in segments],
    }


def test_chunks_over_http_then_followed_by_an_operator(client, started):
    api, _, run, fence = started
    answer = api.post(wire.LOG_APPEND, chunk(fence, 1, ("stdout", 0, b"hello\n"), ("stderr", 0, b"oops\n")))
    assert answer.status_code == 200, answer.json()
    assert answer.json() == {
        "status": "stored",
        "nextSeq": 2,
        "intervalSeconds": 3.0,
        "truncated": False,
        "storedBytes": 11,
    }
    replay = api.post(wire.LOG_APPEND, chunk(fence, 1, ("stdout", 0, b"hello\n"), ("stderr", 0, b"oops\n")))
    assert replay.json()["status"] == "idempotent"
    conflict = api.post(wire.LOG_APPEND, chunk(fence, 1, ("stdout", 0, b"other\n")))
    refused(conflict, 409, "log_chunk_conflict")

    headers = operator_headers("viewer", role="viewer")
    log = client.get(f"/api/v1/ops/runs/{run.pk}/log", headers=headers)
    assert log.status_code == 200 and log["Content-Type"].startswith("text/plain")
    assert log.content == b"hello\noops\n"
    assert (log["X-Log-Next-Offset"], log["X-Log-Complete"], log["X-Log-Attempt"]) == ("11", "false", "1")
    api.post(wire.LOG_APPEND, chunk(fence, 2, ("stdout", 6, b"more\n")))
    follow = client.get(f"/api/v1/ops/runs/{run.pk}/log?after=11", headers=headers)
    assert (follow.content, follow["X-Log-Next-Offset"]) == (b"more\n", "16")
    errors = client.get(f"/api/v1/ops/runs/{run.pk}/log?stream=stderr&attempt=1", headers=headers)
    assert (errors.content, errors["X-Log-Next-Offset"]) == (b"oops\n", "16")


@pytest.mark.parametrize(
    "query, field",
    [
        ("after=-1", "after"),
        ("after=x", "after"),
        ("stream=both", "stream"),
        ("attempt=0", "attempt"),
        ("tail=1", "tail"),
    ],
)
def test_a_bad_log_query_is_a_400_naming_the_parameter(client, started, query, field):
    _, _, run, _ = started
    answer = client.get(
        f"/api/v1/ops/runs/{run.pk}/log?{query}", headers=operator_headers("v", role="viewer")
    )
    assert answer.status_code == 400 and answer.json()["field"] == field, answer.json()


def test_an_unknown_attempt_is_a_404(client, started):
    _, _, run, _ = started
    answer = client.get(
        f"/api/v1/ops/runs/{run.pk}/log?attempt=7", headers=operator_headers("v", role="viewer")
    )
    refused(answer, 404, "log_not_found")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"seq": 0}, "seq"),
        ({"seq": 2**31 - 1}, "seq"),  # its next seq would not fit the log's counter
        ({"segments": []}, "segments"),
        ({"segments": [{"stream": "stdin", "offset": 0, "content": ""}]}, "segments"),
        ({"segments": [{"stream": "stdout", "offset": 0, "content": "not base64!"}]}, "segments"),
        ({"segments": [{"stream": "stdout", "offset": -1, "content": ""}]}, "segments"),
    ],
)
def test_a_malformed_chunk_is_a_400_naming_the_field(started, change, field):
    api, _, _, fence = started
    answer = api.post(wire.LOG_APPEND, {**chunk(fence, 1, ("stdout", 0, b"x")), **change})
    assert answer.status_code == 400, answer.json()
    assert answer.json()["field"].startswith(field), answer.json()
    assert not LogChunk.objects.exists()


def test_the_largest_seq_is_stored_and_its_next_seq_fits(started):
    api, _, _, fence = started
    answer = api.post(wire.LOG_APPEND, chunk(fence, 2**31 - 2, ("stdout", 0, b"last\n")))
    assert answer.status_code == 200, answer.json()
    assert answer.json()["nextSeq"] == 2**31 - 1
    assert LogChunk.objects.get().seq == 2**31 - 2


def test_a_chunk_above_the_body_limit_is_a_413_before_parsing(started):
    api, _, _, fence = started
    answer = api.post(wire.LOG_APPEND, chunk(fence, 1, ("stdout", 0, b"x" * (wire.LOG_CHUNK_BYTES * 2))))
    refused(answer, 413, "body_too_large")
    # a full chunk fits the limit
    full = api.post(wire.LOG_APPEND, chunk(fence, 1, ("stdout", 0, b"x" * wire.LOG_CHUNK_BYTES)))
    assert full.status_code == 200, full.json()


def test_a_chunk_after_an_operator_took_the_session_offline_is_refused_and_stored_nowhere(started):
    api, session, _, fence = started
    api.post(wire.LOG_APPEND, chunk(fence, 1, ("stdout", 0, b"before\n")))
    session_operator_offline(worker_id=session.worker.worker_id, force=True, actor="ops")  # settles the lease
    before = output_rows()
    answer = api.post(wire.LOG_APPEND, chunk(fence, 2, ("stdout", 7, b"after\n")))
    assert answer.status_code in (409, 410), answer.json()
    assert answer.json()["code"] in ("session_offline", "session_not_active", "lease_released"), answer.json()
    assert output_rows() == before


def test_an_artifact_round_trip_and_an_over_limit_refusal(client, started, output_dir):
    api, _, run, fence = started
    content = bytes(range(256)) * 300  # 76,800 bytes: three parts
    digest = hashlib.sha256(content).hexdigest()
    step = wire.ARTIFACT_PART_BYTES
    for offset in range(0, len(content), step):
        answer = api.post(
            wire.ARTIFACT_UPLOAD,
            {
                **fence,
                "name": "result.bin",
                "size": len(content),
                "sha256": digest,
                "offset": offset,
                "content": b64(content[offset : offset + step]),
            },
        )
        assert answer.status_code == 200, answer.json()
    assert answer.json()["status"] == "stored"
    over = api.post(
        wire.ARTIFACT_UPLOAD,
        {**fence, "name": "big.bin", "size": 100_001, "sha256": "0" * 64, "offset": 0, "content": ""},
    )
    refused(over, 413, "artifact_limit_exceeded")
    assert over.json()["field"] == "maxFileBytes" and over.json()["details"] == {"limit": 100_000}

    headers = operator_headers("reader", role="viewer")
    listed = client.get(f"/api/v1/ops/runs/{run.pk}/artifacts", headers=headers)
    assert listed.status_code == 200
    [item] = listed.json()
    assert (item["name"], item["size"], item["sha256"], item["attempt"]) == (
        "result.bin",
        len(content),
        digest,
        1,
    )
    download = client.get(f"/api/v1/ops/runs/{run.pk}/artifacts/{item['id']}", headers=headers)
    assert download.status_code == 200 and download["X-Checksum-Sha256"] == digest
    body = b"".join(download.streaming_content)
    assert hashlib.sha256(body).hexdigest() == digest and body == content
    missing = client.get(f"/api/v1/ops/runs/{run.pk}/artifacts/{item['id'] + 99}", headers=headers)
    refused(missing, 404, "artifact_not_found")


def test_reading_logs_needs_the_view_run_permission(client, started):
    _, _, run, _ = started
    assert client.get(f"/api/v1/ops/runs/{run.pk}/log").status_code in (401, 403)
    assert client.get(f"/api/v1/ops/runs/{run.pk}/artifacts").status_code in (401, 403)


def test_each_attempt_keeps_its_own_log(client):
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(make_revision(max_attempts=2, retry_on=("failed",), retry_backoff_seconds=1))
    first = start(claim_one(session))
    append(first, 1, b"first attempt\n")
    complete(first, outcome="failed", exit_code=1)
    make_retry_due(run.pk)
    assert sweep_due_retries() == 1
    second = start(claim_one(session))
    append(second, 1, b"second attempt\n")
    headers = operator_headers("v", role="viewer")
    latest = client.get(f"/api/v1/ops/runs/{run.pk}/log", headers=headers)
    assert (latest.content, latest["X-Log-Attempt"], latest["X-Log-Complete"]) == (
        b"second attempt\n",
        "2",
        "false",
    )
    earlier = client.get(f"/api/v1/ops/runs/{run.pk}/log?attempt=1", headers=headers)
    assert (earlier.content, earlier["X-Log-Complete"]) == (b"first attempt\n", "true")


def _warnings(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and needle in r.getMessage()]


def test_an_artifact_whose_stored_file_was_deleted_is_a_410_and_one_warning(client, output_dir, caplog):
    run = enqueue(make_revision(output=OutputSpec(paths=("*.bin",))))
    held = start(claim_one(register(enrolled_worker())))
    upload(held, "gone.bin", b"bytes that will vanish")
    artifact = Artifact.objects.get(run_id=run.pk, name="gone.bin")
    (output_dir / artifact.storage_name).unlink()
    headers = operator_headers("reader", role="viewer")
    answer = client.get(f"/api/v1/ops/runs/{run.pk}/artifacts/{artifact.pk}", headers=headers)
    refused(answer, 410, "artifact_gone")
    assert answer["Content-Type"].startswith("application/json")
    assert len(_warnings(caplog, artifact.storage_name)) == 1


def test_a_compacted_log_whose_object_was_deleted_is_a_410_and_one_warning(client, output_dir, caplog):
    run = enqueue(make_revision())
    held = start(claim_one(register(enrolled_worker())))
    append(held, 1, b"soon gone\n")
    complete(held)
    assert log_compact(attempt_id=held.attempt_id) is True
    name = AttemptLog.objects.get(pk=held.attempt_id).object_name
    (output_dir / name).unlink()
    headers = operator_headers("reader", role="viewer")
    answer = client.get(f"/api/v1/ops/runs/{run.pk}/log", headers=headers)
    refused(answer, 410, "log_gone")
    assert len(_warnings(caplog, name)) == 1


def test_an_empty_trailing_gap_segment_is_stored_as_its_marker(client, started):
    api, _, run, fence = started
    assert api.post(wire.LOG_APPEND, chunk(fence, 1, ("stdout", 0, b"abc\n"))).status_code == 200
    gap = api.post(wire.LOG_APPEND, chunk(fence, 2, ("stdout", 10, b"")))  # 6 bytes dropped at the end
    assert gap.status_code == 200, gap.json()
    log = client.get(f"/api/v1/ops/runs/{run.pk}/log", headers=operator_headers("v", role="viewer"))
    assert (
        log.content
        == b"abc\n[qinglong] gap: 6 bytes of stdout were lost before they reached the control plane\n"
    )


def test_a_zero_byte_artifact_is_stored(client, started, output_dir):
    api, _, run, fence = started
    empty = hashlib.sha256(b"").hexdigest()
    answer = api.post(
        wire.ARTIFACT_UPLOAD,
        {**fence, "name": "empty.bin", "size": 0, "sha256": empty, "offset": 0, "content": ""},
    )
    assert answer.status_code == 200, answer.json()
    assert answer.json()["status"] == "stored"
    artifact = Artifact.objects.get(pk=answer.json()["artifactId"])
    assert (output_dir / artifact.storage_name).read_bytes() == b""
    download = client.get(
        f"/api/v1/ops/runs/{run.pk}/artifacts/{artifact.pk}", headers=operator_headers("v", role="viewer")
    )
    assert download.status_code == 200 and b"".join(download.streaming_content) == b""


@pytest.mark.parametrize("query", ["after=" + "9" * 4301, "attempt=" + "1" * 4301, "after=" + "0" * 21])
def test_an_overlong_integer_in_the_log_query_is_a_json_400(client, started, query):
    _, _, run, _ = started
    answer = client.get(
        f"/api/v1/ops/runs/{run.pk}/log?{query}", headers=operator_headers("v", role="viewer")
    )
    assert answer.status_code == 400 and answer["Content-Type"] == "application/json", answer.content[:200]
    assert answer.json()["field"] == query.split("=")[0]


@pytest.mark.parametrize(
    "path, field",
    [
        ("/api/v1/ops/runs?limit=" + "9" * 4301, "limit"),
        ("/api/v1/ops/schedules/preview?cron=*+*+*+*+*&count=" + "9" * 4301, "count"),
    ],
)
def test_an_overlong_integer_query_parameter_is_a_json_400_everywhere(client, path, field):
    answer = client.get(path, headers=operator_headers("admin", role="admin"))
    assert answer.status_code == 400, answer.content[:200]
    assert answer.json()["field"] == field


def test_a_star_does_not_cross_directories_and_control_characters_are_refused(started):
    api, _, _, fence = started  # declared: "*.bin"
    digest = hashlib.sha256(b"x").hexdigest()
    part = {**fence, "size": 1, "sha256": digest, "offset": 0, "content": b64(b"x")}
    deep = api.post(wire.ARTIFACT_UPLOAD, {**part, "name": "sub/dir/deep.bin"})
    refused(deep, 422, "artifact_not_declared")
    for name in ("a\nb.bin", "a\rb.bin", "a\x00b.bin", "a\x1bb.bin"):
        answer = api.post(wire.ARTIFACT_UPLOAD, {**part, "name": name})
        assert answer.status_code == 400 and answer.json()["field"] == "name", answer.json()
    assert api.post(wire.ARTIFACT_UPLOAD, {**part, "name": "top.bin"}).json()["status"] == "stored"
    assert not Artifact.objects.exclude(name="top.bin").exists()


def test_an_expired_log_and_artifact_are_a_410_and_the_run_page_says_so(
    client, output_dir, django_capture_on_commit_callbacks
):
    run = enqueue(make_revision(output=OutputSpec(paths=("*.bin",))))
    held = start(claim_one(register(enrolled_worker())))
    append(held, 1, b"kept for a while\n")
    stored = upload(held, "kept.bin", b"bytes")
    complete(held)
    assert log_compact(attempt_id=held.attempt_id)
    past = db_now() - timedelta(seconds=1)
    AttemptLog.objects.filter(pk=held.attempt_id).update(expires_at=past)
    Artifact.objects.filter(pk=stored.artifact_id).update(expires_at=past)
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_output_retention() == 2
    headers = operator_headers("reader", role="viewer")
    log = client.get(f"/api/v1/ops/runs/{run.pk}/log", headers=headers)
    refused(log, 410, "log_expired")
    assert log.json()["details"]["expiredAt"].startswith(past.date().isoformat())
    artifact = client.get(f"/api/v1/ops/runs/{run.pk}/artifacts/{stored.artifact_id}", headers=headers)
    refused(artifact, 410, "artifact_expired")
    assert client.get(f"/api/v1/ops/runs/{run.pk}/artifacts", headers=headers).json() == []
    client.force_login(get_user_model().objects.create_superuser("root", password="correct horse battery"))
    page = client.get(f"/admin/runs/run/{run.pk}/change/").content.decode()
    assert f"log expired on {past.date().isoformat()}" in page
