"""The hot worker endpoints (``api.hot``) answer exactly as DRF's dispatch of the same view.

Each request is sent twice through the whole middleware stack, signed afresh each time: once as
the agent sends it (served by ``api.hot``) and once with ``Accept: application/json, */*``, which
DRF negotiates to the same plain JSON but ``api.hot`` hands to DRF. Refusals must match byte for
byte — status, body and headers (the request id aside) — and nothing may be written by either.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from rest_framework.permissions import AllowAny

from api.base import WorkerAPIView
from api.hot import hot_endpoint
from api.leases.views import ClaimView
from protocol import strictjson, wire
from tests.helpers import (
    OfferTicket,
    SignedClient,
    enqueue,
    enrolled_worker,
    heartbeat,
    make_revision,
    register,
    send,
    signed_headers,
    snapshot_rows,
)
from tests.leases.flows import claim_one, start

pytestmark = pytest.mark.django_db

#: DRF answers this with plain ``application/json``, as it answers the agent's requests.
THROUGH_DRF = {"Accept": "application/json, */*"}
_VARYING_HEADERS = {"x-request-id"}


@pytest.fixture
def dispatched(monkeypatch) -> list[str]:
    """The views DRF dispatched (``WorkerAPIView.initial`` runs only under DRF's dispatch)."""
    seen: list[str] = []
    initial = WorkerAPIView.initial

    def counted(self, request, *args, **kwargs):
        seen.append(type(self).__name__)
        return initial(self, request, *args, **kwargs)

    monkeypatch.setattr(WorkerAPIView, "initial", counted)
    return seen


@pytest.fixture
def world(client):
    worker, other = enrolled_worker(), enrolled_worker()
    session, other_session = register(worker), register(other)
    enqueue(make_revision()), enqueue(make_revision())
    held = start(claim_one(session))
    lease = held.wire_fence()
    return SignedClient(client, worker), session, other_session, held, lease


def _answer(response) -> tuple[int, bytes, dict[str, str]]:
    headers = {k: v for k, v in response.headers.items() if k.lower() not in _VARYING_HEADERS}
    return response.status_code, response.content, headers


def _refusals(session, other_session, held, lease):
    ticket = OfferTicket()
    offer = {"offerId": str(ticket.offer_id), "leaseToken": ticket.token}
    ack = {**lease, "offerId": str(held.ticket.offer_id), "leaseVersion": 0}
    done = {**lease, "sequence": 1, "outcome": "succeeded", "exitCode": 0}
    stale = {**session.fence(), "generation": session.generation + 1}
    return [
        (wire.CLAIM, {**session.fence(), "offers": [{**offer, "leaseToken": "short"}]}),
        (wire.CLAIM, {**session.fence(), "offers": [offer], "extra": 1}),
        (wire.CLAIM, {**stale, "offers": [offer]}),
        (wire.CLAIM, {**other_session.fence(), "offers": [offer]}),
        (wire.CLAIM, b'{"sessionId": "a", "sessionId": "b"}'),
        (wire.CLAIM, b'{"offers": [{"offerId": '),
        (wire.CLAIM, b"[]"),
        (wire.LEASE_STARTING, {**ack, "leaseVersion": "0"}),
        (wire.LEASE_STARTING, {**ack, "leaseToken": OfferTicket().token}),
        (wire.LEASE_RUNNING, {**ack, "pid": -1, "executorHandle": "h"}),
        (wire.LEASE_RENEW, {**lease, "leaseVersion": 99}),
        (wire.LEASE_COMPLETE, {**done, "outcome": "exploded"}),
        (wire.LEASE_COMPLETE, {**done, "attemptId": "not-a-uuid"}),
        (wire.SESSION_HEARTBEAT, heartbeat(session, availableSlots=-1)),
        (wire.SESSION_HEARTBEAT, heartbeat(session, expectedVersion=session.version + 5)),
        (wire.SESSION_HEARTBEAT, {**heartbeat(session), "sessionId": str(other_session.session_id)}),
    ]


def test_refusals_are_the_same_bytes_as_drf_gives_and_write_nothing(world, dispatched):
    api, session, other_session, held, lease = world
    for path, body in _refusals(session, other_session, held, lease):
        before = snapshot_rows()
        hot = api.post(path, body)
        assert dispatched == [], (path, body)
        drf = api.post(path, body, headers=THROUGH_DRF)
        assert len(dispatched) == 1, (path, body)  # this one went through DRF
        dispatched.clear()
        assert 400 <= hot.status_code < 500, (path, body, hot.content)
        assert _answer(hot) == _answer(drf), (path, body)
        assert snapshot_rows() == before, (path, body)


def test_authentication_refusals_are_the_same_bytes_as_drf_gives(world, client, dispatched):
    api, session, _, _, _ = world
    raw = b'{"sessionId": "x"}'
    cases = [
        {},  # no signature at all
        signed_headers(api.worker, wire.SESSION_HEARTBEAT, b"{}"),  # the digest of another body
        signed_headers(api.worker, wire.CLAIM, raw),  # signed for another path
    ]
    for signature in cases:
        hot = send(client, wire.SESSION_HEARTBEAT, raw, signature)
        drf = send(client, wire.SESSION_HEARTBEAT, raw, {**signature, **THROUGH_DRF})
        assert hot.status_code == 401 and hot["WWW-Authenticate"]
        assert _answer(hot) == _answer(drf)
    assert dispatched == ["HeartbeatView"] * len(cases)


def test_a_replayed_signature_is_refused_on_either_road(world, client):
    api, session, _, _, _ = world
    raw = strictjson.dumps(heartbeat(session))
    headers = signed_headers(api.worker, wire.SESSION_HEARTBEAT, raw)
    first = send(client, wire.SESSION_HEARTBEAT, raw, headers)
    assert first.status_code == 200, first.content
    through_drf = send(client, wire.SESSION_HEARTBEAT, raw, {**headers, **THROUGH_DRF})
    assert through_drf.status_code == 401 and through_drf.json()["code"] == "signature_replayed"
    hot = send(client, wire.SESSION_HEARTBEAT, raw, headers)
    assert _answer(hot) == _answer(through_drf)


def test_answers_carry_drf_headers_and_the_same_document(world, dispatched):
    api, session, _, _, _ = world
    hot = api.post(wire.SESSION_HEARTBEAT, heartbeat(session))
    drf = api.post(wire.SESSION_HEARTBEAT, heartbeat(session), headers=THROUGH_DRF)
    assert hot.status_code == drf.status_code == 200
    assert _answer(hot)[2] == _answer(drf)[2]  # Allow, Content-Type, the security headers…
    assert hot["Allow"] == "POST, OPTIONS" and hot["Content-Type"] == "application/json"
    clock = ("serverTime", "nextHeartbeatAt")  # read at each request
    assert {k: v for k, v in hot.json().items() if k not in clock} == {
        k: v for k, v in drf.json().items() if k not in clock
    }  # an unchanged heartbeat: the same session document
    assert dispatched == ["HeartbeatView"]


@pytest.mark.parametrize(
    ("method", "path", "extra", "status"),
    [
        ("OPTIONS", wire.CLAIM, {}, 401),  # DRF authenticates before it looks at the method
        ("GET", wire.CLAIM, {}, 401),
        ("POST", wire.CLAIM + "?format=json", {}, 401),
        ("POST", wire.CLAIM, {"Accept": "text/html"}, 406),  # negotiated before authentication
        ("POST", wire.CLAIM, {"Accept": "application/json; indent=4"}, 401),
    ],
)
def test_requests_that_are_not_ordinary_go_to_drf(client, dispatched, method, path, extra, status):
    answer = client.generic(method, path, b"", content_type="application/json", headers=extra)
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"].startswith("application/json")
    assert dispatched == ["ClaimView"]


class _Open(ClaimView):
    permission_classes = [AllowAny]


class _OwnInitial(ClaimView):
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)


@pytest.mark.parametrize(("view_class", "named"), [(_Open, "permission_classes"), (_OwnInitial, "initial")])
def test_a_view_served_otherwise_than_a_worker_view_is_refused_at_import(view_class, named):
    with pytest.raises(ImproperlyConfigured, match=named):
        hot_endpoint(view_class)
