"""A completion that carries the next claim (docs/leases.md, "The next claim"): the result is
recorded first and stands whatever the claim does; a malformed offer refuses the whole call with
nothing written; a resend replays both halves."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from actions.leases import claims, next_claim
from actions.leases import completion as completion_module
from actions.leases.claims import OfferRequest
from actions.leases.next_claim import lease_complete_and_claim
from actions.sessions.shutdown import session_drain
from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import Run
from tests.concurrency.threads import LockHolder, libpq_params
from tests.helpers import OfferTicket, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import Held, claim_one, completion, lease_rows, start

pytestmark = pytest.mark.django_db


def running(max_concurrent: int = 1) -> tuple[Held, Run]:
    """A session of ``max_concurrent`` slots running one attempt, and a second run queued."""
    session = register(enrolled_worker(), max_concurrent=max_concurrent)
    revision = make_revision()
    enqueue(revision)
    held = start(claim_one(session))
    return held, enqueue(revision)


def complete_and_claim(held: Held, *tickets: OfferTicket, **changes):
    return lease_complete_and_claim(
        **held.fence(**changes),
        completion=completion(),
        offers=[OfferRequest(t.offer_id, t.token) for t in tickets],
    )


def test_the_completion_is_recorded_then_the_freed_slot_claims_the_next_run():
    held, queued = running(max_concurrent=1)  # the next claim fits only once the slot is free
    ticket = OfferTicket()
    result, next_claim = complete_and_claim(held, ticket)
    assert (result.outcome, next_claim.refused) == ("succeeded", None)
    assert held.lease().state == "completed"
    [offer] = next_claim.offers
    assert (offer.status, offer.lease.run_id, offer.lease.offer_id) == ("claimed", queued.pk, ticket.offer_id)
    assert Run.objects.get(pk=queued.pk).state == "dispatching"


def test_no_runnable_work_answers_no_offers_and_no_refusal():
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = start(claim_one(session))
    result, next_claim = complete_and_claim(held, OfferTicket())
    assert result.outcome == "succeeded"
    assert (next_claim.offers, next_claim.refused) == ([], None)


def test_a_draining_session_records_the_completion_and_answers_the_claims_refusal():
    held, queued = running()
    session = held.session
    session_drain(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=session.version,
    )
    result, next_claim = complete_and_claim(held, OfferTicket())
    assert result.outcome == "succeeded" and held.lease().state == "completed"
    assert next_claim.offers == [] and next_claim.refused is not None
    assert next_claim.refused.code == "session_draining"
    assert Run.objects.get(pk=queued.pk).state == "queued"


def test_a_refused_completion_claims_nothing():
    held, queued = running()
    with pytest.raises(DomainError) as refused:
        complete_and_claim(held, OfferTicket(), lease_token=OfferTicket().token)
    assert refused.value.code == "lease_token_mismatch"
    assert held.lease().state == "leased"
    assert Run.objects.get(pk=queued.pk).state == "queued"


@pytest.mark.parametrize("bad", ["duplicate offer id", "duplicate token", "no offers"])
def test_a_malformed_offer_refuses_the_whole_call_naming_its_field_and_writes_nothing(bad):
    held, _ = running(max_concurrent=2)
    first = OfferTicket()
    offers = {
        "duplicate offer id": [first, OfferTicket(offer_id=first.offer_id)],
        "duplicate token": [first, OfferTicket(token=first.token)],
        "no offers": [],
    }[bad]
    before = lease_rows()
    with pytest.raises(DomainError) as refused:
        complete_and_claim(held, *offers)
    assert refused.value.code == "validation_failed"
    assert (
        refused.value.field
        == {
            "duplicate offer id": "next.offers[1].offerId",
            "duplicate token": "next.offers[1].leaseToken",
            "no offers": "next.offers",
        }[bad]
    )
    assert lease_rows() == before


def test_a_resend_replays_the_completion_and_the_same_offer():
    held, queued = running()
    ticket = OfferTicket()
    first_result, first = complete_and_claim(held, ticket)
    leases = RunDispatchLease.objects.count()
    again_result, again = complete_and_claim(held, ticket)
    assert again_result == first_result
    [offer] = again.offers
    assert offer.status == "idempotent"
    assert (offer.lease.pk, offer.lease.run_id) == (first.offers[0].lease.pk, queued.pk)
    assert RunDispatchLease.objects.count() == leases


def test_a_database_failing_the_claim_is_its_refusal_and_the_completion_stands(monkeypatch):
    """Review finding 3: the completion is committed when the claim runs; a database error there
    must not answer 503 for the whole call (the worker would resend a recorded completion until
    its hard deadline). Any other error still propagates. The two-call road (on PostgreSQL the
    one call rolls both parts back on such an error, and this road answers: the test below)."""
    monkeypatch.setattr(next_claim, "_in_one_call", lambda **_: None)
    held, queued = running()

    def unreachable(**_):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(next_claim, "lease_claim", unreachable)
    result, answered = complete_and_claim(held, OfferTicket())
    assert result.outcome == "succeeded" and held.lease().state == "completed"
    assert answered.offers == [] and answered.refused is not None
    assert answered.refused.code == "database_unavailable"
    assert Run.objects.get(pk=queued.pk).state == "queued"

    held2, _ = running()

    def broken(**_):
        raise RuntimeError("a bug")

    monkeypatch.setattr(next_claim, "lease_claim", broken)
    with pytest.raises(RuntimeError):
        complete_and_claim(held2, OfferTicket())


postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's one call (migration leases 0017)"
)


@postgresql_only
def test_pg_the_completion_and_its_claim_are_one_statement(protocol_settings):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # the ranking's hold leaves a fresh run to Python
    held, queued = running()
    with CaptureQueriesContext(connection) as queries:
        result, answered = complete_and_claim(held, OfferTicket())
    assert result.outcome == "succeeded" and held.lease().state == "completed"
    assert [offer.lease.run_id for offer in answered.offers] == [queued.pk]
    calls = [q["sql"] for q in queries if "ql_lease_" in q["sql"]]
    assert len(calls) == 1 and "ql_lease_complete_and_claim(" in calls[0], calls


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_pg_a_failed_one_call_wrote_nothing_and_the_two_call_road_answers(monkeypatch):
    """The one call fails before it commits (an outage, a QL409 race, a lock timeout): nothing of
    it stands, and the two-call road records the completion and claims the next run, once each."""
    held, queued = running()
    real = next_claim.call_function
    failed: list[str] = []

    def failing_once(sql, params):
        if "ql_lease_complete_and_claim(" in sql and not failed:
            failed.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return real(sql, params)

    monkeypatch.setattr(next_claim, "call_function", failing_once)
    result, answered = complete_and_claim(held, OfferTicket())
    assert failed and result.outcome == "succeeded" and held.lease().state == "completed"
    assert [offer.lease.run_id for offer in answered.offers] == [queued.pk]
    assert RunDispatchLease.objects.filter(run_id=queued.pk).count() == 1


@postgresql_only
def test_pg_a_claim_the_one_call_leaves_to_python_is_answered_after_the_completion():
    """An offer id this worker already used: the function's claim part hands it back (nothing
    written), and the completion it committed stands; the claim is answered as a claim would be."""
    held, _ = running(max_concurrent=2)
    other = start(claim_one(held.session))  # the second slot takes the queued run
    result, answered = complete_and_claim(held, OfferTicket(offer_id=other.ticket.offer_id))
    assert result.outcome == "succeeded" and held.lease().state == "completed"
    assert answered.offers == [] and answered.refused is not None
    assert answered.refused.code == "lease_offer_conflict"


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_pg_a_database_lost_while_the_claim_learns_after_the_one_call_is_the_claims_refusal(
    protocol_settings, monkeypatch
):
    """Review finding: the one call committed the completion and its claim part answered a
    placement class this process had not evaluated; learning it reads the database, which went
    away at that moment (its backend terminated from another connection). The completion stands
    and the claim is refused with the outage's code, as on the two-call road; not a 503."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)
    held, _ = running()
    # a placement class this process has not evaluated (unique: an earlier test may have met any other)
    enqueue(make_revision(placement={"required": {"labels": {"zone": f"eu-{uuid.uuid4().hex}"}}}))
    learn = claims._learn_classes
    killed: list[int] = []

    def lost_meanwhile(*args, **kwargs):
        if not killed:
            killed.append(connection.connection.info.backend_pid)
            with psycopg.connect(**libpq_params(), autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", killed)
        return learn(*args, **kwargs)

    monkeypatch.setattr(claims, "_learn_classes", lost_meanwhile)
    result, answered = complete_and_claim(held, OfferTicket())
    connection.close()
    assert killed and result.outcome == "succeeded" and held.lease().state == "completed"
    assert answered.offers == [] and answered.refused is not None
    assert answered.refused.code == "database_unavailable"


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_pg_a_lock_timeout_in_the_one_call_is_answered_without_a_second_wait(protocol_settings, monkeypatch):
    """Review finding: the one call's lock wait ran out (another transaction holds the worker
    row); it is answered ``lock_timeout`` as the completion's own call answers it, not retried
    on the two-call road (a second wait of ``lock_timeout``). Nothing is written."""
    protocol_settings(DISPATCH_HOLD_SECONDS=0)
    held, _ = running()
    calls: list[str] = []
    real = completion_module.call_function

    def counted(sql, params):
        calls.append(sql)
        return real(sql, params)

    monkeypatch.setattr(completion_module, "call_function", counted)
    holder = LockHolder(held.session.worker.worker_id)
    holder.start()
    assert holder.locked.wait(10)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 200")
        with pytest.raises(DomainError) as refused:
            complete_and_claim(held, OfferTicket())
    finally:
        holder.release.set()
        holder.join(10)
        connection.close()  # the SET goes with it
    assert refused.value.code == "lock_timeout"
    assert calls == []  # the two-call road's completion was never tried
    assert held.lease().state == "leased"
