"""Claim → starting → running → complete over signed HTTP, and the completion fences."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.metrics import WORKER_CALLS
from leases.models import RunDispatchLease
from protocol import strictjson, wire
from runs.models import Run, RunAttempt
from tests.helpers import OfferTicket, SignedClient, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import lease_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def started(client):
    """A worker whose session holds a running attempt, claimed and ACKed over HTTP."""
    worker = enrolled_worker()
    session = register(worker)
    run = enqueue(make_revision(command="echo hi"))
    api = SignedClient(client, worker)
    ticket = OfferTicket()
    claimed = api.post(
        wire.CLAIM,
        {
            **session.fence(),
            "workerId": str(worker.worker_id),
            "offers": [{"offerId": str(ticket.offer_id), "leaseToken": ticket.token}],
        },
    )
    assert claimed.status_code == 200, claimed.json()
    offer = claimed.json()["offers"][0]
    assert offer["status"] == "claimed" and offer["execution"]["runId"] == str(run.pk)
    assert offer["execution"]["command"] == "echo hi"
    lease = offer["lease"]
    fence = {
        **session.fence(),
        "attemptId": lease["attemptId"],
        "leaseGeneration": lease["leaseGeneration"],
        "leaseToken": ticket.token,
    }
    ack = api.post(wire.LEASE_STARTING, {**fence, "offerId": str(ticket.offer_id), "leaseVersion": 0})
    assert ack.status_code == 200, ack.json()
    ack = api.post(
        wire.LEASE_RUNNING,
        {
            **fence,
            "offerId": str(ticket.offer_id),
            "leaseVersion": 0,
            "pid": 4242,
            "pgid": 4242,
            "executorHandle": "pid=4242 pgid=4242",
        },
    )
    assert ack.status_code == 200, ack.json()
    assert Run.objects.get(pk=run.pk).state == "running"
    return api, session, worker, run, fence


def complete_body(fence, **changes):
    return {
        **fence,
        "sequence": 1,
        "outcome": "succeeded",
        "exitCode": 0,
        "stdoutTail": "hi\n",
        "stderrTail": "",
        **changes,
    }


def test_claim_start_run_complete_over_signed_http(started):
    api, _, _, run, fence = started
    done = api.post(wire.LEASE_COMPLETE, complete_body(fence))
    assert done.status_code == 200, done.json()
    assert done.json()["outcome"] == "succeeded"
    run.refresh_from_db()
    assert run.state == "succeeded" and run.exit_code == 0
    attempt = RunAttempt.objects.get(run=run)
    assert attempt.state == "succeeded" and attempt.stdout_tail == "hi\n" and attempt.pid == 4242
    lease = RunDispatchLease.objects.get(attempt=attempt)
    assert lease.state == "completed" and lease.completion_sequence == 1
    # the raw token is nowhere in the database
    assert fence["leaseToken"] not in str(list(RunDispatchLease.objects.values()))

    before = lease_rows()
    replay = api.post(wire.LEASE_COMPLETE, complete_body(fence))
    assert replay.status_code == 200 and replay.json() == done.json()
    assert lease_rows() == before
    conflicting = api.post(wire.LEASE_COMPLETE, complete_body(fence, outcome="failed", exitCode=1))
    assert conflicting.status_code == 409 and conflicting.json()["code"] == "lease_completed"
    assert lease_rows() == before


def test_completion_with_a_wrong_token_is_refused_and_writes_nothing(started):
    api, *_, fence = started
    before = lease_rows()
    answer = api.post(wire.LEASE_COMPLETE, complete_body(fence, leaseToken="A" * 43))
    assert answer.status_code == 409 and answer.json()["code"] == "lease_token_mismatch"
    assert answer.json()["field"] == "leaseToken"
    assert lease_rows() == before


def test_completion_from_an_old_session_is_refused_and_writes_nothing(started):
    api, session, worker, _, fence = started
    register(worker)  # the process restarted: generation 2 fences generation 1 and settles its lease
    before = lease_rows()
    answer = api.post(wire.LEASE_COMPLETE, complete_body(fence))
    assert answer.status_code == 409 and answer.json()["code"] == "session_superseded"
    assert lease_rows() == before


def test_completion_after_lease_expiry_is_refused_and_writes_nothing(started):
    api, *_, fence = started
    lease = RunDispatchLease.objects.get(attempt_id=fence["attemptId"])
    RunDispatchLease.objects.filter(pk=lease.pk).update(expires_at=lease.claimed_at - timedelta(seconds=1))
    before = lease_rows()
    answer = api.post(wire.LEASE_COMPLETE, complete_body(fence))
    assert answer.status_code == 409 and answer.json()["code"] == "lease_expired"
    assert lease_rows() == before


def test_claim_replay_rebuilds_the_same_offer_and_another_token_conflicts(client):
    worker = enrolled_worker()
    session = register(worker)
    enqueue(make_revision())
    api = SignedClient(client, worker)
    ticket = OfferTicket()
    body = {**session.fence(), "offers": [{"offerId": str(ticket.offer_id), "leaseToken": ticket.token}]}
    first = api.post(wire.CLAIM, body)
    second = api.post(wire.CLAIM, body)
    assert first.status_code == second.status_code == 200
    assert second.json()["offers"][0]["status"] == "idempotent"
    assert first.json()["offers"][0]["execution"] == second.json()["offers"][0]["execution"]
    assert RunDispatchLease.objects.count() == 1
    other = {**session.fence(), "offers": [{"offerId": str(ticket.offer_id), "leaseToken": "B" * 43}]}
    conflict = api.post(wire.CLAIM, other)
    assert conflict.status_code == 409 and conflict.json()["code"] == "lease_offer_conflict"
    assert conflict.json()["field"] == "offers[0].offerId"


def claims_counted(outcome: str) -> float:
    """``qinglong_worker_calls_total{call="claim", outcome=…}`` as this process counted it."""
    return WORKER_CALLS.labels(call="claim", outcome=outcome)._value.get()


def next_offer() -> tuple[OfferTicket, dict]:
    ticket = OfferTicket()
    return ticket, {"offerId": str(ticket.offer_id), "leaseToken": ticket.token}


def test_a_completion_with_next_answers_its_result_and_the_next_offer(started):
    api, _, _, run, fence = started
    queued = enqueue(make_revision(command="echo next"))
    ticket, offer = next_offer()
    offered = claims_counted("offered")
    done = api.post(wire.LEASE_COMPLETE, complete_body(fence, next={"offers": [offer]}))
    assert done.status_code == 200, done.json()
    assert claims_counted("offered") == offered + 1  # the metrics count it as the claim it is
    answer = done.json()
    assert answer["outcome"] == "succeeded" and "refused" not in answer["next"]
    [claimed] = answer["next"]["offers"]
    assert claimed["status"] == "claimed" and claimed["lease"]["offerId"] == str(ticket.offer_id)
    assert claimed["execution"]["runId"] == str(queued.pk) and claimed["execution"]["command"] == "echo next"
    assert Run.objects.get(pk=run.pk).state == "succeeded"
    assert Run.objects.get(pk=queued.pk).state == "dispatching"
    assert "next" not in api.post(wire.LEASE_COMPLETE, complete_body(fence)).json()  # a plain replay


def test_a_completion_whose_next_claim_is_refused_still_answers_its_result(started):
    api, session, worker, run, fence = started
    queued = enqueue(make_revision())
    drained = api.post(wire.SESSION_DRAIN, {**session.fence(), "expectedVersion": session.version})
    assert drained.status_code == 200, drained.json()
    refused = claims_counted("session_draining")
    done = api.post(wire.LEASE_COMPLETE, complete_body(fence, next={"offers": [next_offer()[1]]}))
    assert done.status_code == 200, done.json()
    assert done.json()["next"]["offers"] == []
    assert done.json()["next"]["refused"]["code"] == "session_draining"
    assert claims_counted("session_draining") == refused + 1
    assert Run.objects.get(pk=run.pk).state == "succeeded"
    assert Run.objects.get(pk=queued.pk).state == "queued"


@pytest.mark.parametrize(
    ("next_claim", "field"),
    [
        ({"offers": []}, "next.offers"),
        ({"offers": [{"offerId": "not-a-uuid", "leaseToken": "A" * 43}]}, "next.offers[0].offerId"),
        (
            {"offers": [{"offerId": str(OfferTicket().offer_id), "leaseToken": "short"}]},
            "next.offers[0].leaseToken",
        ),
        ({"offers": [], "wait": 1}, "next.wait"),
        ([], "next"),
    ],
)
def test_a_malformed_next_claim_is_a_400_naming_the_field_and_completes_nothing(started, next_claim, field):
    api, *_, fence = started
    enqueue(make_revision())
    before = lease_rows()
    answer = api.post(wire.LEASE_COMPLETE, complete_body(fence, next=next_claim))
    assert answer.status_code == 400, answer.json()
    assert (answer.json()["code"], answer.json()["field"]) == ("validation_failed", field)
    assert lease_rows() == before


def test_an_offer_twice_in_the_next_claim_is_a_400_and_completes_nothing(started):
    api, *_, fence = started
    _, offer = next_offer()
    before = lease_rows()
    answer = api.post(
        wire.LEASE_COMPLETE, complete_body(fence, next={"offers": [offer, {**offer, "leaseToken": "C" * 43}]})
    )
    assert answer.status_code == 400, answer.json()
    assert (answer.json()["code"], answer.json()["field"]) == ("validation_failed", "next.offers[1].offerId")
    assert lease_rows() == before


def test_a_completion_of_the_largest_tails_json_can_write_is_taken_with_its_next_claim(started):
    """Review of the next claim, finding 7: a job's coloured output is mostly control characters,
    which JSON writes as six bytes each; two full tails of them, the fences and a next claim's
    eight offers must fit the completion's body limit, or the result is lost with a 413."""
    api, _, _, run, fence = started
    tail = "\x1b" * wire.OUTPUT_TAIL_BYTES
    offers = [next_offer()[1] for _ in range(wire.MAX_OFFERS_PER_CLAIM)]
    body = complete_body(fence, stdoutTail=tail, stderrTail=tail, next={"offers": offers})
    assert len(strictjson.dumps(body)) > 96 * 1024
    done = api.post(wire.LEASE_COMPLETE, body)
    assert done.status_code == 200, done.json()
    assert RunAttempt.objects.get(run=run).stdout_tail == tail


def test_a_next_claim_reusing_an_offer_id_is_refused_naming_it_and_the_completion_stands(started):
    api, _, _, run, fence = started
    offer_id = RunDispatchLease.objects.get(attempt_id=fence["attemptId"]).offer_id  # claimed already
    reused = {"offerId": str(offer_id), "leaseToken": "D" * 43}
    done = api.post(wire.LEASE_COMPLETE, complete_body(fence, next={"offers": [reused]}))
    assert done.status_code == 200, done.json()
    refused = done.json()["next"]["refused"]
    assert (refused["code"], refused["field"]) == ("lease_offer_conflict", "next.offers[0].offerId")
    assert Run.objects.get(pk=run.pk).state == "succeeded"
