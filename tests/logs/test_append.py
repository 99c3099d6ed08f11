"""Log chunks (docs/logs.md, Log chunks): fenced by the run lease like renewal and completion,
idempotent on exact replay, conflicts named, gaps and truncation visible, secrets masked."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

import actions.logs as log_actions
from actions.leases.expiry import sweep_expired_leases
from actions.logs import log_compact
from core.errors import DomainError
from logs import rules
from logs.models import AttemptLog, LogChunk
from logs.selectors import read_log
from runs.revisions import OutputSpec
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, expire_lease, start, starting
from tests.logs.flows import append, append_segments, output_rows

pytestmark = pytest.mark.django_db


def running(**policy):
    session = register(enrolled_worker())
    run = enqueue(make_revision(**policy))
    return start(claim_one(session)), run


def text(held) -> bytes:
    return read_log(held.attempt()).data


def test_chunks_are_stored_in_order_with_both_streams_and_read_back():
    held, _ = running()
    assert append(held, 1, b"out 1\n").status == "stored"
    assert append(held, 2, b"err 1\n", stream="stderr").status == "stored"
    answer = append(held, 3, b"out 2\n")
    assert (answer.next_seq, answer.stored_bytes, answer.truncated) == (4, 18, False)
    assert answer.interval_seconds > 0
    assert text(held) == b"out 1\nerr 1\nout 2\n"
    attempt = held.attempt()
    assert read_log(attempt, stream="stdout").data == b"out 1\nout 2\n"
    assert read_log(attempt, stream="stderr").data == b"err 1\n"
    follow = read_log(attempt, after=6)
    assert (follow.data, follow.next_offset) == (b"err 1\nout 2\n", 18)
    assert read_log(attempt, after=18).data == b""


def test_an_exact_replay_changes_nothing_and_other_content_is_a_conflict():
    held, _ = running()
    first = append(held, 1, b"hello\n")
    before = output_rows()
    replay = append(held, 1, b"hello\n", offset=0)
    assert replay.status == "idempotent" and replay.next_seq == first.next_seq
    assert output_rows() == before
    with pytest.raises(DomainError) as refused:
        append(held, 1, b"HELLO\n", offset=0)
    assert (refused.value.code, refused.value.field) == ("log_chunk_conflict", "seq")
    assert output_rows() == before


@pytest.mark.parametrize(
    "spoil, code",
    [
        (lambda held: {"lease_token": "A" * 43}, "lease_token_mismatch"),
        (lambda held: {"generation": held.session.generation + 1}, "session_generation_mismatch"),
        (lambda held: {"lease_generation": held.lease_generation + 1}, "lease_generation_mismatch"),
    ],
)
def test_a_chunk_with_a_wrong_fence_is_refused_and_stored_nowhere(spoil, code):
    held, _ = running()
    append(held, 1, b"ok\n")
    before = output_rows()
    with pytest.raises(DomainError) as refused:
        append(held, 2, b"forged\n", **spoil(held))
    assert refused.value.code == code
    assert output_rows() == before


def test_a_chunk_from_a_superseded_session_is_refused():
    enrolled = enrolled_worker()
    session = register(enrolled)
    enqueue(make_revision())
    held = start(claim_one(session))
    append(held, 1, b"old session\n")
    before = output_rows()
    register(enrolled)  # the same worker registers a new session: the old one is superseded
    with pytest.raises(DomainError) as refused:
        append(held, 2, b"late\n")
    assert refused.value.code in ("session_superseded", "session_generation_mismatch", "session_not_active")
    assert output_rows() == before


def test_chunks_for_a_completed_lease_are_refused_even_as_replays():
    held, _ = running()
    append(held, 1, b"one\n")
    complete(held)
    before = output_rows()
    with pytest.raises(DomainError) as refused:
        append(held, 2, b"after completion\n")
    assert refused.value.code == "lease_completed"
    with pytest.raises(DomainError) as replayed:
        append(held, 1, b"one\n", offset=0)
    assert replayed.value.code == "lease_completed"
    assert output_rows() == before


def test_a_chunk_for_a_lapsed_lease_is_refused():
    other, _ = running()
    expire_lease(other.attempt_id)
    with pytest.raises(DomainError) as lapsed:
        append(other, 1, b"late\n")
    assert lapsed.value.code == "lease_expired"
    assert not LogChunk.objects.filter(attempt_id=other.attempt_id).exists()


def test_a_chunk_before_the_running_ack_is_refused():
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = claim_one(session)
    starting(held)
    with pytest.raises(DomainError) as refused:
        append(held, 1, b"early\n")
    assert refused.value.code == "attempt_not_started"
    assert not AttemptLog.objects.exists()


def test_gaps_in_sequence_and_offset_are_marker_lines():
    held, _ = running()
    append(held, 1, b"line 1\n")
    append(held, 3, b"line 3\n")  # chunk 2 never arrived
    append(held, 4, b"after drop\n", offset=100)  # the agent dropped bytes 14..100
    stored = text(held)
    assert b"[qinglong] gap: log chunk 2 never arrived\n" in stored
    assert b"[qinglong] gap: 86 bytes of stdout were lost" in stored
    assert stored.startswith(b"line 1\n") and stored.endswith(b"after drop\n")
    with pytest.raises(DomainError) as late:
        append(held, 2, b"line 2\n", offset=7)
    assert (late.value.code, late.value.details) == ("log_chunk_conflict", {"nextSeq": 5})


def test_a_marker_starts_a_line_of_its_own():
    held, _ = running()
    append(held, 1, b"no newline")
    append(held, 2, b"x\n", offset=20)
    assert text(held) == b"no newline" + rules.gap_marker("stdout", 10, at_line_start=False) + b"x\n"


def test_the_cap_keeps_the_first_bytes_then_one_truncation_marker(output_settings):
    output_settings(LOG_MAX_BYTES=10)
    held, _ = running()
    assert append(held, 1, b"12345678\n").status == "stored"
    capped = append(held, 2, b"abcdef\n")
    assert (capped.status, capped.truncated) == ("truncated", True)
    assert append(held, 3, b"more\n").status == "truncated"
    assert text(held) == b"12345678\na" + rules.truncation_marker(10, at_line_start=False)
    assert LogChunk.objects.filter(attempt_id=held.attempt_id).count() == 2


@pytest.mark.parametrize(
    "content, kept",
    [
        ("12345678\né".encode(), b"12345678\n"),  # 2 bytes, the cut falls after the first
        ("1234567\n€".encode(), b"1234567\n"),  # 3 bytes, cut after two of them
        ("12345678\na€".encode(), b"12345678\na"),
        (b"12345678\n\x80\x80", b"12345678\n\x80"),  # not UTF-8: cut where the cap says
    ],
)
def test_the_cap_does_not_cut_a_utf8_character_in_half(output_settings, content, kept):
    output_settings(LOG_MAX_BYTES=10)
    held, _ = running()
    assert append(held, 1, content).status == "truncated"
    assert text(held) == kept + rules.truncation_marker(10, at_line_start=kept.endswith(b"\n"))


def test_secret_values_are_masked_before_storage():
    env = {"API_TOKEN": "s3cr3t-value", "PLAIN": "visible"}
    held, _ = running(env=env, output=OutputSpec(secret_env=("API_TOKEN",)))
    append(held, 1, b"token=s3cr3t-value plain=visible\n")
    stored = text(held)
    assert stored == b"token=[MASKED] plain=visible\n"
    assert not LogChunk.objects.filter(data__contains=b"s3cr3t").exists()


def test_over_the_byte_rate_a_chunk_is_refused_with_backpressure(output_settings):
    output_settings(LOG_RATE_BYTES_PER_SECOND=1000)
    held, _ = running()
    assert append(held, 1, b"x" * 600).interval_seconds == 6.0  # over half the rate: slower
    before = output_rows()
    with pytest.raises(DomainError) as refused:
        append(held, 2, b"y" * 600)
    assert (refused.value.code, refused.value.retry_after) == ("log_backpressure", 1)
    assert output_rows() == before


def test_compaction_writes_one_object_and_reads_stay_the_same(output_dir):
    held, _ = running()
    append(held, 1, b"out\n")
    append(held, 2, b"err\n", stream="stderr")
    append(held, 3, b"out again\n")
    live = text(held)
    assert log_compact(attempt_id=held.attempt_id) is False  # still running
    complete(held)
    assert log_compact(attempt_id=held.attempt_id) is True
    log = AttemptLog.objects.get(pk=held.attempt_id)
    assert log.compacted_at is not None and log.expires_at > log.compacted_at
    assert not LogChunk.objects.filter(attempt_id=held.attempt_id).exists()
    assert (output_dir / log.object_name).read_bytes() == live
    attempt = held.attempt()
    assert read_log(attempt).data == live and read_log(attempt).complete
    assert read_log(attempt, stream="stdout").data == b"out\nout again\n"
    assert read_log(attempt, after=8, stream="stderr").data == b""
    assert read_log(attempt, after=4, stream="stderr").data == b"err\n"
    assert read_log(attempt, after=2).data == live[2:]


def test_one_chunk_interleaves_both_streams_in_read_order():
    held, _ = running()
    answer = append_segments(
        held, 1, [("stdout", None, b"a\n"), ("stderr", None, b"b\n"), ("stdout", None, b"c\n")]
    )
    assert (answer.status, answer.stored_bytes) == ("stored", 6)
    assert text(held) == b"a\nb\nc\n"
    assert read_log(held.attempt(), stream="stdout").data == b"a\nc\n"
    assert append_segments(
        held, 1, [("stdout", 0, b"a\n"), ("stderr", 0, b"b\n"), ("stdout", 2, b"c\n")]
    ).status == ("idempotent")
    with pytest.raises(DomainError) as refused:
        append_segments(held, 2, [("stderr", 0, b"again\n")])
    assert (refused.value.code, refused.value.field) == ("log_chunk_conflict", "segments[0].offset")


def test_a_chunk_for_a_released_lease_is_refused():
    held, _ = running()
    append(held, 1, b"before\n")
    expire_lease(held.attempt_id)
    assert sweep_expired_leases() >= 1
    assert held.lease().state == "released"
    before = output_rows()
    with pytest.raises(DomainError) as refused:
        append(held, 2, b"after\n")
    assert refused.value.code == "lease_released"
    assert output_rows() == before


def test_the_completion_tails_are_masked_too():
    env = {"API_TOKEN": "s3cr3t-value"}
    held, _ = running(env=env, output=OutputSpec(secret_env=("API_TOKEN",)))
    complete(held, stdout="the token is s3cr3t-value\n")
    assert held.attempt().stdout_tail == "the token is [MASKED]\n"


def test_a_secret_split_across_two_chunks_is_masked_on_both_sides():
    env = {"API_TOKEN": "s3cr3t-value"}
    held, _ = running(env=env, output=OutputSpec(secret_env=("API_TOKEN",)))
    append(held, 1, b"token=s3cr")
    append(held, 2, b"3t-val", stream="stderr")  # the other stream does not continue it
    append(held, 3, b"3t-value done\n")
    stored = text(held)
    assert b"s3cr" not in stored and b"3t-value" not in stored
    assert read_log(held.attempt(), stream="stdout").data == b"token=****[MASKED] done\n"
    complete(held)
    assert log_compact(attempt_id=held.attempt_id) is True
    assert b"s3cr" not in read_log(held.attempt()).data


def test_a_secret_sent_one_byte_per_chunk_is_never_stored_whole():
    env = {"API_TOKEN": "s3cr3t-value"}
    held, _ = running(env=env, output=OutputSpec(secret_env=("API_TOKEN",)))
    for seq, byte in enumerate(b"<s3cr3t-value>", start=1):
        append(held, seq, bytes([byte]))
    assert text(held) == b"<" + b"*" * 11 + b"[MASKED]>"


@contextmanager
def another_process():
    """Appends inside come from another server process: afterwards this process remembers each
    log as it was before (``actions.logs`` keeps the state of the logs it wrote, PostgreSQL)."""
    saved = dict(log_actions._known)
    yield
    log_actions._known.clear()
    log_actions._known.update(saved)


def test_a_log_another_process_moved_on_is_continued_from_its_stored_state():
    held, _ = running()
    append(held, 1, b"one\n")
    with another_process():
        append(held, 2, b"two\n")
    # Planned from this process's memory, chunk 3 would follow a missing chunk 2.
    answer = append(held, 3, b"three\n")
    assert (answer.status, answer.next_seq, answer.stored_bytes) == ("stored", 4, 14)
    assert text(held) == b"one\ntwo\nthree\n"


def test_a_replay_of_what_another_process_stored_is_idempotent():
    held, _ = running()
    append(held, 1, b"one\n")
    with another_process():
        append(held, 2, b"two\n")
    before = output_rows()
    replay = append(held, 2, b"two\n", offset=4)
    assert (replay.status, replay.next_seq) == ("idempotent", 3)
    assert output_rows() == before


def test_a_chunk_only_an_old_memory_of_the_log_would_take_is_refused_on_the_stored_log():
    held, _ = running()
    append(held, 1, b"one\n")
    with another_process():
        append(held, 2, b"two two\n")
    before = output_rows()
    with pytest.raises(DomainError) as behind:
        append(held, 3, b"late\n", offset=6)  # past "one\n", but behind "two two\n"
    assert (behind.value.code, behind.value.field) == ("log_chunk_conflict", "segments[0].offset")
    assert output_rows() == before


def test_a_secret_begun_in_a_chunk_another_process_stored_is_masked_on_both_sides():
    env = {"API_TOKEN": "s3cr3t-value"}
    held, _ = running(env=env, output=OutputSpec(secret_env=("API_TOKEN",)))
    append(held, 1, b"one\n")
    with another_process():
        append(held, 2, b"token=s3cr")
    append(held, 3, b"3t-value\n", offset=14)
    assert text(held) == b"one\ntoken=****[MASKED]\n"
