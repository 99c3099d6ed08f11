"""The agent's live-log buffer and shipper (agent/output.py): bounded, oldest-first drop with the
stream offsets kept, both streams interleaved in read order, a failed chunk resent with its
sequence number, the cap honoured."""

from __future__ import annotations

import base64
import threading

from agent.client import ApiError, TransportError
from agent.output import LogShipper, OutputBuffer


def test_the_buffer_drops_oldest_first_and_keeps_offsets():
    buffer = OutputBuffer(limit=10)
    buffer.write("stdout", b"aaaa")
    buffer.write("stderr", b"bbbb")
    buffer.write("stdout", b"cccccc")  # 14 bytes: the 4 oldest go
    assert buffer.size == 10
    assert buffer.dropped == {"stdout": 4, "stderr": 0}
    assert buffer.take() == [("stderr", 0, b"bbbb"), ("stdout", 4, b"cccccc")]
    buffer.write("stdout", b"x" * 25)  # bigger than the buffer: only its newest 10 bytes stay
    assert buffer.take() == [("stdout", 25, b"x" * 10)]
    assert buffer.read_offsets == {"stdout": 35, "stderr": 4}


def test_take_merges_contiguous_bytes_and_splits_at_the_limit():
    buffer = OutputBuffer(limit=100)
    for block in (b"ab", b"cd"):
        buffer.write("stdout", block)
    buffer.write("stderr", b"EF")
    buffer.write("stdout", b"gh")
    assert buffer.take(max_bytes=5) == [("stdout", 0, b"abcd"), ("stderr", 0, b"E")]
    assert buffer.take() == [("stderr", 1, b"F"), ("stdout", 4, b"gh")]
    assert buffer.take() == []


def test_a_write_never_blocks_while_a_send_hangs():
    buffer = OutputBuffer(limit=1024)
    release = threading.Event()

    def send(body, patience):
        release.wait(10)
        raise TransportError("down")

    shipper = LogShipper(buffer, send)
    shipper.start()
    for _ in range(10_000):  # 10 MB through a 1 KiB buffer while the only send hangs
        buffer.write("stdout", b"y" * 1000)
    assert buffer.size <= 1024
    release.set()
    shipper.stop()
    shipper.join(10)


def test_a_failed_chunk_is_resent_with_the_same_sequence_then_the_rest_follows():
    buffer = OutputBuffer()
    sent: list[dict] = []
    failures = [TransportError("down")]

    def send(body, patience):
        if failures:
            raise failures.pop()
        sent.append(body)
        return {"status": "stored", "intervalSeconds": 0.05, "truncated": False}

    shipper = LogShipper(buffer, send)
    buffer.write("stdout", b"one\n")
    shipper.start()
    buffer.write("stderr", b"two\n")
    assert shipper.finish(10)
    assert [body["seq"] for body in sent] == list(range(1, len(sent) + 1))
    streams = [segment["stream"] for body in sent for segment in body["segments"]]
    assert streams == ["stdout", "stderr"]


def test_a_truncated_answer_stops_the_log_and_a_refusal_ends_it():
    buffer = OutputBuffer()
    calls = []

    def send(body, patience):
        calls.append(body)
        return {"status": "truncated", "intervalSeconds": 1, "truncated": True}

    shipper = LogShipper(buffer, send)
    buffer.write("stdout", b"x" * 100)
    shipper.start()
    shipper.finish(10)
    buffer.write("stdout", b"more")
    assert len(calls) == 1 and buffer.size == 0 and shipper.truncated

    refused = OutputBuffer()

    def refuse(body, patience):
        raise ApiError(409, "lease_completed", "gone")

    other = LogShipper(refused, refuse)
    refused.write("stdout", b"late\n")
    other.start()
    assert other.finish(10) is False and other.lost


def test_a_drop_at_the_end_is_reported_by_an_empty_segment_at_the_final_offset():
    buffer = OutputBuffer(limit=4)
    sent: list[dict] = []

    def send(body, patience):
        sent.append(body)
        return {"status": "stored", "intervalSeconds": 0.05, "truncated": False}

    shipper = LogShipper(buffer, send)
    shipper.start()
    assert shipper.finish(10)
    sent.clear()
    # everything below was written after the last send, and the last 4 bytes are all that stayed
    buffer.write("stdout", b"0123456789")
    shipper2 = LogShipper(buffer, send)
    shipper2.sent_ends["stdout"] = 0
    shipper2.start()
    assert shipper2.finish(10)
    assert [s["offset"] for body in sent for s in body["segments"]] == [6]


def test_a_secret_written_one_byte_at_a_time_is_masked_before_it_is_buffered():
    buffer = OutputBuffer(secrets=[b"s3cr3t-value"])
    taken: list[bytes] = []
    for byte in b"a s3cr3t-value, s3cr3t-v":
        buffer.write("stdout", bytes([byte]))
        taken.extend(data for _, _, data in buffer.take())  # every read may be shipped at once
    assert b"".join(taken) == b"a [MASKED], "  # "s3cr3t-v" could still become the secret
    buffer.end_streams()
    taken.extend(data for _, _, data in buffer.take())
    assert b"".join(taken) == b"a [MASKED], s3cr3t-v"
    assert buffer.read_offsets["stdout"] == len(b"a [MASKED], s3cr3t-v")


def test_the_shipper_flushes_the_held_back_bytes_at_the_end():
    buffer = OutputBuffer(secrets=[b"s3cr3t-value"])
    sent: list[dict] = []

    def send(body, patience):
        sent.append(body)
        return {"status": "stored", "nextSeq": body["seq"] + 1, "intervalSeconds": 0.05, "truncated": False}

    shipper = LogShipper(buffer, send)
    shipper.start()
    for byte in b"x=s3cr3t-value\ny=s3c":
        buffer.write("stdout", bytes([byte]))
    assert shipper.finish(10)
    shipped = b"".join(base64.b64decode(s["content"]) for body in sent for s in body["segments"])
    assert shipped == b"x=[MASKED]\ny=s3c"
