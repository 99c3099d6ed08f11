"""Bad input to the lease endpoints is a 4xx naming the field — never a 500, never a write."""

from __future__ import annotations

import pytest

from audit.models import Event
from leases.models import RunDispatchLease
from protocol import wire
from runs.models import RunAttempt
from tests.helpers import OfferTicket, SignedClient, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client):
    worker = enrolled_worker()
    session = register(worker)
    enqueue(make_revision()), enqueue(make_revision())
    held = start(claim_one(session))
    lease = held.wire_fence()
    return SignedClient(client, worker), session, held, lease


def snapshot():
    return (
        list(RunDispatchLease.objects.order_by("pk").values()),
        list(RunAttempt.objects.order_by("pk").values()),
        Event.objects.count(),
    )


def _cases(session, held, lease):
    ticket = OfferTicket()
    offer = {"offerId": str(ticket.offer_id), "leaseToken": ticket.token}
    ack = {**lease, "offerId": str(held.ticket.offer_id), "leaseVersion": 0}
    done = {**lease, "sequence": 1, "outcome": "succeeded", "exitCode": 0}
    return [
        (
            wire.CLAIM,
            {**session.fence(), "offers": [offer, {**offer, "leaseToken": OfferTicket().token}]},
            "offers[1].offerId",
        ),
        (
            wire.CLAIM,
            {**session.fence(), "offers": [offer, {**offer, "offerId": str(OfferTicket().offer_id)}]},
            "offers[1].leaseToken",
        ),
        (
            wire.CLAIM,
            {**session.fence(), "offers": [{**offer, "leaseToken": "too-short"}]},
            "offers[0].leaseToken",
        ),
        (wire.CLAIM, {**session.fence(), "offers": [offer] * 9}, "offers"),
        (wire.CLAIM, {**session.fence(), "offers": []}, "offers"),
        (wire.CLAIM, {**session.fence(), "offers": [{**offer, "extra": 1}]}, "offers[0].extra"),
        (wire.LEASE_RENEW, {**lease, "leaseVersion": 2**31}, "leaseVersion"),
        (wire.LEASE_RENEW, {**lease, "leaseGeneration": 2**70, "leaseVersion": 0}, "leaseGeneration"),
        (wire.LEASE_RENEW, {**lease, "leaseGeneration": 0, "leaseVersion": 0}, "leaseGeneration"),
        (wire.LEASE_RENEW, {**lease, "leaseGeneration": "1", "leaseVersion": 0}, "leaseGeneration"),
        (wire.LEASE_RENEW, {**lease, "leaseVersion": -1}, "leaseVersion"),
        (wire.LEASE_RENEW, {**lease}, "leaseVersion"),
        (wire.LEASE_RENEW, {**lease, "leaseVersion": 0, "attemptId": "nope"}, "attemptId"),
        (wire.LEASE_RELEASE, {**lease, "leaseVersion": 0, "leaseToken": "x" * 129}, "leaseToken"),
        (wire.LEASE_STARTING, {**ack, "offerId": 7}, "offerId"),
        # one id, one spelling: braces, a URN and bare digits name the same UUID (DRF took them)
        (wire.LEASE_STARTING, {**ack, "offerId": "{" + ack["offerId"] + "}"}, "offerId"),
        (wire.LEASE_STARTING, {**ack, "offerId": "urn:uuid:" + ack["offerId"]}, "offerId"),
        (wire.LEASE_STARTING, {**ack, "offerId": ack["offerId"].replace("-", "")}, "offerId"),
        (
            wire.CLAIM,
            {**session.fence(), "offers": [{**offer, "offerId": offer["offerId"] + "\n"}]},
            "offers[0].offerId",
        ),
        (wire.LEASE_RUNNING, {**ack, "pid": 0, "executorHandle": "h"}, "pid"),
        (wire.LEASE_RUNNING, {**ack, "pid": 1, "executorHandle": "h" * 513}, "executorHandle"),
        (wire.LEASE_START_FAILED, {**ack, "reason": "bored"}, "reason"),
        (wire.LEASE_COMPLETE, {**done, "outcome": "lost"}, "outcome"),
        (wire.LEASE_COMPLETE, {**done, "exitCode": 256}, "exitCode"),
        (wire.LEASE_COMPLETE, {**done, "exitCode": 1}, "exitCode"),
        (wire.LEASE_COMPLETE, {**done, "sequence": 0}, "sequence"),
        (wire.LEASE_COMPLETE, {**done, "stdoutTail": "é" * 4097}, "stdoutTail"),
        (wire.LEASE_COMPLETE, {**done, "stderrTail": 5}, "stderrTail"),
    ]


def test_bad_lease_input_is_a_4xx_naming_the_field(api):
    client, session, held, lease = api
    for path, body, field in _cases(session, held, lease):
        before = snapshot()
        answer = client.post(path, body)
        assert 400 <= answer.status_code < 500, (path, field, answer.status_code, answer.content)
        assert answer.json()["field"] == field, (path, answer.json())
        assert snapshot() == before, (path, field)
