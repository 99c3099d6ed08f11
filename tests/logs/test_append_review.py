"""Log chunks found wanting in review (issue 14), on both stores' append paths: binary job output
under a secret; a session generation past its 64-bit column."""

from __future__ import annotations

import uuid

import pytest

from logs.models import AttemptLog, LogChunk
from logs.selectors import read_log
from protocol import wire
from runs.revisions import OutputSpec
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, start
from tests.logs.flows import append
from tests.logs.test_http import chunk, started  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db

SECRET = {"API_TOKEN": "s3cr3t-value"}


def test_binary_output_with_nul_bytes_is_stored_when_the_task_has_a_secret():
    # The stream's tail (kept to mask a secret split across chunks) is a JSON column: PostgreSQL's
    # jsonb refuses U+0000, so a NUL in the last bytes of a chunk was a 500 and the chunk, sent
    # again and again by the agent, was never stored.
    session = register(enrolled_worker())
    enqueue(make_revision(env=SECRET, output=OutputSpec(secret_env=("API_TOKEN",))))
    held = start(claim_one(session))
    assert append(held, 1, b"\x7fELF\x00\x01\x02").status == "stored"
    assert append(held, 2, b"\x00token=s3cr").status == "stored"  # a secret begins after a NUL
    assert append(held, 3, b"3t-value\x00 done\n").status == "stored"
    stored = read_log(held.attempt()).data
    assert stored == b"\x7fELF\x00\x01\x02\x00token=****[MASKED]\x00 done\n"
    assert "\x00" not in AttemptLog.objects.get(pk=held.attempt_id).stream_tails["stdout"]


@pytest.mark.parametrize("generation", [2**63, 10**19 - 1])
def test_a_session_generation_past_its_column_is_a_400_naming_it(started, generation):  # noqa: F811
    # Generations are 64-bit columns; on PostgreSQL ql_log_append took the number as bigint:
    # "bigint out of range", a 500 (the strict JSON parser already refuses 20 digits and more).
    api, _, _, fence = started
    answer = api.post(wire.LOG_APPEND, {**chunk(fence, 1, ("stdout", 0, b"x")), "generation": generation})
    assert answer.status_code == 400, answer.content
    assert (answer.json()["code"], answer.json()["field"]) == ("validation_failed", "generation")
    assert not LogChunk.objects.exists()


def test_the_largest_session_generation_is_a_generation_mismatch(started):  # noqa: F811
    api, _, _, fence = started
    answer = api.post(wire.LOG_APPEND, {**chunk(fence, 1, ("stdout", 0, b"x")), "generation": 2**63 - 1})
    assert (answer.status_code, answer.json()["code"]) == (409, "session_generation_mismatch")
    assert not LogChunk.objects.exists()


@pytest.mark.parametrize("path", [wire.CLAIM, wire.LEASE_RENEW, wire.LEASE_RELEASE])
def test_the_other_postgresql_functions_get_no_generation_past_its_column(started, path):  # noqa: F811
    # ql_lease_claim and ql_lease_release took it as numeric and were not found: a 500 too.
    api, _, _, fence = started
    bodies = {
        wire.CLAIM: {
            "sessionId": fence["sessionId"],
            "offers": [{"offerId": str(uuid.uuid4()), "leaseToken": fence["leaseToken"]}],
        },
        wire.LEASE_RENEW: {**fence, "leaseVersion": 0},
        wire.LEASE_RELEASE: {**fence, "leaseVersion": 0},
    }
    answer = api.post(path, {**bodies[path], "generation": 2**63})
    assert answer.status_code == 400, answer.content
    assert (answer.json()["code"], answer.json()["field"]) == ("validation_failed", "generation")
