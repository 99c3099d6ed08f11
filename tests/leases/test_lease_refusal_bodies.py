"""Every refusal (and replay) of the activation ACKs and the completion over signed HTTP: the same
status and JSON body on both stores, and nothing written (docs/leases.md, Activation ACKs,
Completion; docs/protocol.md, errors).

On PostgreSQL the calls go through ``ql_lease_ack``/``ql_lease_complete`` (migrations leases
0006, 0007), which hand every case but the success to the ORM path; SQLite has only the ORM path.
The expected answers below were taken from the SQLite store and are asserted on both, ids and
times masked (``<id>``, ``<t>``): a body that differs between the stores fails here.
"""

from __future__ import annotations

import re

import pytest

from actions.leases.renewal import lease_release
from protocol import wire
from tests.helpers import OfferTicket, SignedClient, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import expire_lease, lease_rows

pytestmark = pytest.mark.django_db

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIME = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+(Z|[+-]\d\d:\d\d)")


def _held(client, to):
    """A worker with two offers claimed over HTTP; the first is taken through the ACKs up to ``to``
    (claimed, starting, running, completed); the second is only there to be confused with it."""
    worker = enrolled_worker()
    session = register(worker, max_concurrent=2)
    revision = make_revision(command="echo hi")
    enqueue(revision), enqueue(revision)
    api = SignedClient(client, worker)
    tickets = [OfferTicket(), OfferTicket()]
    claimed = api.post(
        wire.CLAIM,
        {
            **session.fence(),
            "workerId": str(worker.worker_id),
            "offers": [{"offerId": str(t.offer_id), "leaseToken": t.token} for t in tickets],
        },
    ).json()
    leases = {o["lease"]["offerId"]: o["lease"] for o in claimed["offers"]}
    t, other = tickets
    lease = leases[str(t.offer_id)]
    olease = leases[str(other.offer_id)]
    fence = {
        **session.fence(),
        "attemptId": lease["attemptId"],
        "leaseGeneration": lease["leaseGeneration"],
        "leaseToken": t.token,
    }
    s = {
        "api": api,
        "worker": worker,
        "session": session,
        "fence": fence,
        "ticket": t,
        "other": other,
        "olease": olease,
    }
    steps = ["starting", "running", "completed"]
    for step in steps[: steps.index(to) + 1] if to in steps else []:
        s["api"].post(_path(step), _body(s, step))
    return s


def _path(step):
    """The endpoint of ``step`` (starting, running, completed)."""
    return {"starting": wire.LEASE_STARTING, "running": wire.LEASE_RUNNING, "completed": wire.LEASE_COMPLETE}[
        step
    ]


def _body(s, step, **changes):
    """The body the worker sends for ``step`` on the first lease; ``changes`` replace fields
    (``fence``: fields of the lease fence)."""
    fence = {**s["fence"], **changes.pop("fence", {})}
    if step == "starting":
        return {**fence, "offerId": str(s["ticket"].offer_id), "leaseVersion": 0, **changes}
    if step == "running":
        return {
            **fence,
            "offerId": str(s["ticket"].offer_id),
            "leaseVersion": 0,
            "pid": 4242,
            "pgid": 4242,
            "executorHandle": "pid=4242 pgid=4242",
            **changes,
        }
    return {
        **fence,
        "sequence": 1,
        "outcome": "succeeded",
        "exitCode": 0,
        "stdoutTail": "ok\n",
        "stderrTail": "",
        **changes,
    }


def _release(s):
    """The worker released the first lease (before its starting ACK)."""
    f = s["fence"]
    lease_release(
        worker_id=s["worker"].worker_id,
        session_id=s["session"].session_id,
        generation=s["session"].generation,
        attempt_id=f["attemptId"],
        lease_generation=f["leaseGeneration"],
        lease_token=f["leaseToken"],
        lease_version=0,
    )


#: {case: (how far the first lease got, the call, what the call changes, what happened before)}
CASES = {
    "starting token": ("claimed", "starting", lambda s: {"fence": {"leaseToken": OfferTicket().token}}, None),
    "starting offer": ("claimed", "starting", lambda s: {"offerId": str(OfferTicket().offer_id)}, None),
    "starting other lease's offer": (
        "claimed",
        "starting",
        lambda s: {"offerId": str(s["other"].offer_id)},
        None,
    ),
    "starting other lease's token": (
        "claimed",
        "starting",
        lambda s: {"fence": {"leaseToken": s["other"].token}},
        None,
    ),
    "starting other attempt id": (
        "claimed",
        "starting",
        lambda s: {"fence": {"attemptId": s["olease"]["attemptId"]}},
        None,
    ),
    "starting version": ("claimed", "starting", lambda s: {"leaseVersion": 1}, None),
    "starting generation": ("claimed", "starting", lambda s: {"fence": {"leaseGeneration": 2}}, None),
    "starting session gen": ("claimed", "starting", lambda s: {"fence": {"generation": 99}}, None),
    "starting superseded": ("claimed", "starting", lambda s: {}, lambda s: register(s["worker"])),
    "starting expired": (
        "claimed",
        "starting",
        lambda s: {},
        lambda s: expire_lease(s["fence"]["attemptId"], 5),
    ),
    "starting released": ("claimed", "starting", lambda s: {}, _release),
    "starting repeat": ("starting", "starting", lambda s: {}, None),
    "starting after running": ("running", "starting", lambda s: {}, None),
    "starting after completed": ("completed", "starting", lambda s: {}, None),
    "running before starting": ("claimed", "running", lambda s: {}, None),
    "running repeat": ("running", "running", lambda s: {}, None),
    "running handle": ("running", "running", lambda s: {"pid": 99}, None),
    "running token": ("starting", "running", lambda s: {"fence": {"leaseToken": OfferTicket().token}}, None),
    "running expired": (
        "starting",
        "running",
        lambda s: {},
        lambda s: expire_lease(s["fence"]["attemptId"], 5),
    ),
    "running superseded": ("starting", "running", lambda s: {}, lambda s: register(s["worker"])),
    "running after completed": ("completed", "running", lambda s: {}, None),
    "complete before running": ("starting", "completed", lambda s: {}, None),
    "complete token": (
        "running",
        "completed",
        lambda s: {"fence": {"leaseToken": OfferTicket().token}},
        None,
    ),
    "complete other token": (
        "running",
        "completed",
        lambda s: {"fence": {"leaseToken": s["other"].token}},
        None,
    ),
    "complete expired": (
        "running",
        "completed",
        lambda s: {},
        lambda s: expire_lease(s["fence"]["attemptId"], 5),
    ),
    "complete superseded": ("running", "completed", lambda s: {}, lambda s: register(s["worker"])),
    "complete session gen": ("running", "completed", lambda s: {"fence": {"generation": 99}}, None),
    "complete generation": ("running", "completed", lambda s: {"fence": {"leaseGeneration": 2}}, None),
    "complete cancelled no request": (
        "running",
        "completed",
        lambda s: {"outcome": "cancelled", "exitCode": None},
        None,
    ),
    "complete resend": ("completed", "completed", lambda s: {}, None),
    "complete other result": ("completed", "completed", lambda s: {"outcome": "failed", "exitCode": 1}, None),
    "complete other sequence": ("completed", "completed", lambda s: {"sequence": 2}, None),
    "complete succeeded exit 1": ("running", "completed", lambda s: {"exitCode": 1}, None),
}


#: {case: (status, body)}, from the SQLite store.
EXPECTED = {
    "starting token": (
        409,
        {"code": "lease_token_mismatch", "message": "the lease token does not match", "field": "leaseToken"},
    ),
    "starting offer": (
        409,
        {
            "code": "lease_offer_conflict",
            "message": "the offer id does not match the lease",
            "field": "offerId",
        },
    ),
    "starting other lease's offer": (
        409,
        {
            "code": "lease_offer_conflict",
            "message": "the offer id does not match the lease",
            "field": "offerId",
        },
    ),
    "starting other lease's token": (
        409,
        {"code": "lease_token_mismatch", "message": "the lease token does not match", "field": "leaseToken"},
    ),
    "starting other attempt id": (
        409,
        {"code": "lease_token_mismatch", "message": "the lease token does not match", "field": "leaseToken"},
    ),
    "starting version": (
        409,
        {
            "code": "lease_version_conflict",
            "message": "expected lease version 1, the lease is at 0",
            "field": "leaseVersion",
            "details": {"currentVersion": 0},
        },
    ),
    "starting generation": (
        409,
        {
            "code": "lease_generation_mismatch",
            "message": "no lease of this generation",
            "field": "leaseGeneration",
        },
    ),
    "starting session gen": (
        409,
        {
            "code": "session_generation_mismatch",
            "message": "the session's generation is not 99",
            "field": "generation",
        },
    ),
    "starting superseded": (
        409,
        {"code": "session_superseded", "message": "a newer session replaced this one", "field": "sessionId"},
    ),
    "starting expired": (409, {"code": "lease_expired", "message": "the run lease lapsed", "field": None}),
    "starting released": (
        409,
        {
            "code": "lease_released",
            "message": "the run lease was released (worker_release)",
            "field": None,
            "details": {"reason": "worker_release"},
        },
    ),
    "starting repeat": (
        200,
        {
            "status": "already_starting",
            "lease": {
                "attemptId": "<id>",
                "offerId": "<id>",
                "leaseGeneration": 1,
                "leaseVersion": 0,
                "expiresAt": "<t>",
                "renewIntervalSeconds": 15,
            },
            "cancelRequested": False,
        },
    ),
    "starting after running": (
        200,
        {
            "status": "already_running",
            "lease": {
                "attemptId": "<id>",
                "offerId": "<id>",
                "leaseGeneration": 1,
                "leaseVersion": 0,
                "expiresAt": "<t>",
                "renewIntervalSeconds": 15,
            },
            "cancelRequested": False,
        },
    ),
    "starting after completed": (
        409,
        {"code": "lease_completed", "message": "the run lease already completed", "field": None},
    ),
    "running before starting": (
        409,
        {"code": "attempt_not_started", "message": "send the starting ACK first", "field": "attemptId"},
    ),
    "running repeat": (
        200,
        {
            "status": "already_running",
            "lease": {
                "attemptId": "<id>",
                "offerId": "<id>",
                "leaseGeneration": 1,
                "leaseVersion": 0,
                "expiresAt": "<t>",
                "renewIntervalSeconds": 15,
            },
            "cancelRequested": False,
        },
    ),
    "running handle": (
        409,
        {
            "code": "executor_handle_mismatch",
            "message": "the attempt runs under another handle",
            "field": "executorHandle",
        },
    ),
    "running token": (
        409,
        {"code": "lease_token_mismatch", "message": "the lease token does not match", "field": "leaseToken"},
    ),
    "running expired": (409, {"code": "lease_expired", "message": "the run lease lapsed", "field": None}),
    "running superseded": (
        409,
        {"code": "session_superseded", "message": "a newer session replaced this one", "field": "sessionId"},
    ),
    "running after completed": (
        409,
        {"code": "lease_completed", "message": "the run lease already completed", "field": None},
    ),
    "complete before running": (
        409,
        {
            "code": "attempt_not_started",
            "message": "send the running ACK before completing",
            "field": "attemptId",
        },
    ),
    "complete token": (
        409,
        {"code": "lease_token_mismatch", "message": "the lease token does not match", "field": "leaseToken"},
    ),
    "complete other token": (
        409,
        {"code": "lease_token_mismatch", "message": "the lease token does not match", "field": "leaseToken"},
    ),
    "complete expired": (409, {"code": "lease_expired", "message": "the run lease lapsed", "field": None}),
    "complete superseded": (
        409,
        {"code": "session_superseded", "message": "a newer session replaced this one", "field": "sessionId"},
    ),
    "complete session gen": (
        409,
        {
            "code": "session_generation_mismatch",
            "message": "the session's generation is not 99",
            "field": "generation",
        },
    ),
    "complete generation": (
        409,
        {
            "code": "lease_generation_mismatch",
            "message": "no lease of this generation",
            "field": "leaseGeneration",
        },
    ),
    "complete cancelled no request": (
        409,
        {
            "code": "cancel_not_requested",
            "message": "nobody asked to cancel this run; report failed instead",
            "field": "outcome",
        },
    ),
    "complete resend": (
        200,
        {"attemptId": "<id>", "leaseGeneration": 1, "sequence": 1, "outcome": "succeeded"},
    ),
    "complete other result": (
        409,
        {
            "code": "lease_completed",
            "message": "the run lease already completed with another result",
            "field": None,
        },
    ),
    "complete other sequence": (
        409,
        {
            "code": "lease_completed",
            "message": "the run lease already completed with another result",
            "field": None,
        },
    ),
    "complete succeeded exit 1": (
        400,
        {"code": "validation_failed", "message": "a succeeded attempt exits with 0", "field": "exitCode"},
    ),
}


def _masked(value):
    """``value`` with ids and times masked."""
    if isinstance(value, str):
        return TIME.sub("<t>", UUID.sub("<id>", value))
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    return value


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_or_replayed_lease_call_answers_alike_on_both_stores_and_writes_nothing(case, client):
    at, step, change, before = CASES[case]
    s = _held(client, at)
    if before:
        before(s)
    rows = lease_rows()
    answer = s["api"].post(_path(step), _body(s, step, **change(s)))
    assert (answer.status_code, _masked(answer.json())) == EXPECTED[case]
    assert lease_rows() == rows, "a refused or replayed call wrote"
