"""A log append does not lock the worker row (docs/logs.md, Rate): a chunk never waits behind the
worker's claims and heartbeats, which hold that lock, and never holds them up. Real concurrency:
another connection holds the worker row lock while the chunk is appended."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, start
from tests.logs.flows import append
from workers.locks import lock_worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_chunk_is_stored_while_another_transaction_holds_the_worker_row():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no row locks: a write transaction holds the whole database")
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = start(claim_one(session))
    locked, release = threading.Event(), threading.Event()

    def hold_worker_row() -> None:
        try:
            with transaction.atomic():
                lock_worker(held.session.worker.worker_id)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_worker_row)
    holder.start()
    try:
        assert locked.wait(30)
        started = time.monotonic()
        result = append(held, 1, b"while the worker row is locked\n")
        waited = time.monotonic() - started
    finally:
        release.set()
        holder.join(30)
    assert result.status == "stored"
    # The connection's lock_timeout is 5 s: a chunk that locked the worker row would have waited
    # it out and been refused with lock_timeout.
    assert waited < 4.0
