"""Log chunks found wanting in review (issue 14), on both stores' append paths."""

from __future__ import annotations

import pytest

from logs.models import AttemptLog
from logs.selectors import read_log
from runs.revisions import OutputSpec
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, start
from tests.logs.flows import append

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
