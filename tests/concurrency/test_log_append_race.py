"""Three control-plane processes take every chunk of one attempt at the same moment (docs/logs.md,
"On PostgreSQL: one statement").

Each process plans an append from its own memory of the attempt log's state and the database
function writes the plan only while the log row is still in that state. Here three threads with
their own connections play three processes, each with its own memory (``actions.logs._known`` per
thread), and send each of 40 chunks together: every chunk is stored exactly once and answered
``idempotent`` to the other two, and the stored log is exactly the bytes sent — with a secret
straddling chunk boundaries masked. Both stores run it (SQLite serialises the three writers).
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict

import pytest
from django.db import connection

import actions.logs as log_actions
from actions.logs import Chunk, Segment, log_append
from core.errors import DomainError
from runs.revisions import OutputSpec
from tests.logs.test_append import running, text

pytestmark = [pytest.mark.django_db(transaction=True)]

PROCESSES = 3
SECRET = b"s3cr3t-value"


class PerProcessMemory(dict):
    """``actions.logs._known`` with one dictionary per thread: each thread is a process of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def _mine(self) -> dict:
        if not hasattr(self._local, "known"):
            self._local.known = {}
        return self._local.known

    def get(self, key, default=None):
        return self._mine().get(key, default)

    def __setitem__(self, key, value) -> None:
        self._mine()[key] = value

    def __len__(self) -> int:
        return len(self._mine())

    def clear(self) -> None:
        self._mine().clear()


def chunks(secret: bytes | None) -> tuple[list[Chunk], bytes]:
    """40 chunks of 1-3 segments on both streams (seeded), some ending in a secret's prefix."""
    rng = random.Random(7)
    ends, sent, out = {"stdout": 0, "stderr": 0}, b"", []
    for seq in range(1, 41):
        segments = []
        for _ in range(rng.randint(1, 3)):
            stream = rng.choice(["stdout", "stderr"])
            data = bytes(rng.choice(b"abc \n") for _ in range(rng.randint(0, 40)))
            if secret and rng.random() < 0.3:
                data += secret[: rng.randint(1, len(secret))]
            segments.append(Segment(stream, ends[stream], data))
            ends[stream] += len(data)
            sent += data
        out.append(Chunk(seq, tuple(segments)))
    return out, sent


@pytest.mark.parametrize("secret", [None, SECRET], ids=["plain", "secret"])
def test_every_chunk_sent_to_three_processes_at_once_is_stored_once(monkeypatch, secret):
    monkeypatch.setattr(log_actions, "_known", PerProcessMemory())
    if secret:
        held, _ = running(env={"API_TOKEN": secret.decode()}, output=OutputSpec(secret_env=("API_TOKEN",)))
    else:
        held, _ = running()
    sent_chunks, sent = chunks(secret)
    answers: dict[int, list[str]] = defaultdict(list)
    errors: list[str] = []
    together = threading.Barrier(PROCESSES, timeout=30)

    def process() -> None:
        try:
            for chunk in sent_chunks:
                together.wait()
                try:
                    answers[chunk.seq].append(log_append(**held.fence(), chunk=chunk).status)
                except DomainError as exc:
                    answers[chunk.seq].append(exc.code)
        except Exception as exc:  # noqa: BLE001 - asserted on below (a 500 in production)
            errors.append(repr(exc))
            together.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=process) for _ in range(PROCESSES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[0]
    assert sorted(answers) == [chunk.seq for chunk in sent_chunks]
    for seq, statuses in answers.items():
        assert sorted(statuses) == ["idempotent", "idempotent", "stored"], (seq, statuses)
    stored = text(held)
    if secret:
        assert SECRET not in stored
        assert len(stored) == len(sent.replace(SECRET, b"[MASKED]"))
    else:
        assert stored == sent
