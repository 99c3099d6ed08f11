"""A claim blocked behind a held worker-row lock waits, then succeeds — or, past the lock
timeout, fails with the clear ``lock_timeout`` code (503) and writes nothing (ADR-0012 §6 "a
PostgreSQL contract suite covers … lock waits"). Separate connections: one thread holds the
lock, another claims."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.test import Client

from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol import wire
from runs.models import Run, RunAttempt
from tests.concurrency.threads import LockHolder, waits_on_a_lock
from tests.helpers import OfferTicket, SignedClient, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_claim_behind_a_held_worker_lock_waits_then_succeeds():
    session = register(enrolled_worker())
    enqueue(make_revision())
    holder = LockHolder(session.worker.worker_id)
    holder.start()
    assert holder.locked.wait(10)
    outcome: dict = {}
    backend = threading.Event()

    def claimer():
        try:
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    outcome["pid"] = cursor.fetchone()[0]
            backend.set()
            outcome["offers"] = claim(session)
            outcome["done_at"] = time.monotonic()
        except Exception as exc:  # asserted below
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=claimer, daemon=True)
    thread.start()
    assert backend.wait(10)
    if connection.vendor == "postgresql":
        # observe the claim blocked on the row lock (not a guess based on timing)
        deadline = time.monotonic() + 10
        while not waits_on_a_lock(outcome["pid"]):
            assert time.monotonic() < deadline, "the claim never waited on the worker lock"
            time.sleep(0.02)
    else:
        time.sleep(0.3)  # SQLite shows no lock waits: hold the write lock a while instead
    assert "offers" not in outcome and "error" not in outcome  # still waiting
    holder.release.set()
    thread.join(20)
    holder.join(10)
    assert "error" not in outcome, outcome.get("error")
    assert len(outcome["offers"]) == 1
    assert outcome["done_at"] >= holder.released_at
    assert RunDispatchLease.objects.count() == 1


@pytest.mark.postgres
def test_a_claim_blocked_past_the_lock_timeout_fails_with_lock_timeout_and_writes_nothing():
    worker = enrolled_worker()
    session = register(worker)
    enqueue(make_revision())
    holder = LockHolder(worker.worker_id)
    holder.start()
    assert holder.locked.wait(10)
    outcome: dict = {}

    def short_lock_timeout():
        # what QINGLONG_PG_LOCK_TIMEOUT_MS sets for every connection, shortened for this one
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")

    def claimer():
        try:
            short_lock_timeout()
            ticket = OfferTicket()
            api = SignedClient(Client(), worker)
            started = time.monotonic()
            outcome["answer"] = api.post(
                wire.CLAIM,
                {
                    **session.fence(),
                    "offers": [{"offerId": str(ticket.offer_id), "leaseToken": ticket.token}],
                },
            )
            outcome["waited"] = time.monotonic() - started
            short_lock_timeout()  # the failed request may have closed the connection
            with pytest.raises(DomainError) as service_level:
                claim(session)
            outcome["service"] = service_level.value
        except Exception as exc:  # asserted below
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=claimer, daemon=True)
    thread.start()
    thread.join(30)
    holder.release.set()
    holder.join(10)
    assert "error" not in outcome, outcome.get("error")
    answer = outcome["answer"]
    assert answer.status_code == 503, answer.content
    assert answer.json()["code"] == "lock_timeout"
    assert outcome["waited"] >= 0.3
    assert (outcome["service"].code, outcome["service"].status) == ("lock_timeout", 503)
    assert not RunDispatchLease.objects.exists()


@pytest.mark.postgres
def test_a_claim_passes_over_a_run_another_transaction_holds_without_waiting(protocol_settings):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)
    session = register(enrolled_worker())
    revision = make_revision()
    head, second = enqueue(revision, priority=5), enqueue(revision)
    locked, release, outcome = threading.Event(), threading.Event(), {}

    def hold_the_head_run():
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=head.pk)  # e.g. an operator cancelling it
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    def claimer():
        try:
            started = time.monotonic()
            outcome["offers"] = claim(session)
            outcome["took"] = time.monotonic() - started
        except Exception as exc:  # asserted below
            outcome["error"] = exc
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_head_run, daemon=True)
    holder.start()
    assert locked.wait(10)
    thread = threading.Thread(target=claimer, daemon=True)
    thread.start()
    thread.join(20)
    release.set()
    holder.join(10)
    assert "error" not in outcome, outcome.get("error")
    [offer] = outcome["offers"]
    assert RunAttempt.objects.get(pk=offer.attempt_id).run_id == second.pk
    assert outcome["took"] < 2  # it did not wait for the holder (which waited until the claim ended)
