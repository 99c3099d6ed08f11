"""The fail-closed matrix (docs/sessions.md): every session call × every fault, over signed HTTP.

Given a worker whose session is in the state a call needs (a queued run for a claim, a claimed
lease for an ACK, a started one for a renewal, a running one for a completion), when one fault is
applied and the call is made through the signed worker API, then a refused call answers its
documented status and code and changes no row at all, and an allowed call succeeds. The
expectations are data (``MATRIX``); ``test_docs_table_is_the_matrix`` keeps docs/sessions.md
equal to them. Runs on both databases.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from actions.leases.activation import lease_running, lease_starting
from actions.leases.claims import OfferRequest, lease_claim
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.shutdown import session_drain, session_offline, session_operator_offline
from actions.workers import worker_drain, worker_revoke
from core.db import db_now
from core.errors import CATALOGUE, DomainError
from leases.models import RunDispatchLease
from protocol import wire
from protocol.ids import uuid7
from tests.helpers import (
    OfferTicket,
    SignedClient,
    enqueue,
    enrolled_worker,
    make_revision,
    register,
    register_body,
    repository_queries,
    snapshot_rows,
)
from workers.fence import Purpose, check_session
from workers.models import SessionState, Worker, WorkerSession, WorkerState
from workers.principals import principal_for

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sessions.md"

CALLS = ("register", "heartbeat", "drain", "offline", "claim", "ack", "renew", "complete")
FAULTS = (
    "unknown session",
    "superseded session",
    "wrong generation",
    "stale expected version",
    "expired session lease",
    "worker draining",
    "worker offline",
    "worker revoked",
    "principal/body mismatch",
)


@dataclass(frozen=True)
class Expect:
    status: int
    code: str | None = None  # None: the call is allowed and succeeds

    @property
    def allowed(self) -> bool:
        return self.code is None


def _row(register: Expect, *others: Expect) -> dict[str, Expect]:
    """One fault's row: register, then heartbeat..complete (one Expect repeated, or seven)."""
    rest = others * 7 if len(others) == 1 else others
    assert len(rest) == 7
    return dict(zip(CALLS, (register, *rest), strict=True))


ALLOWED_OK = Expect(200)
MATRIX: dict[str, dict[str, Expect]] = {
    # A new session id is how a new process registers: it replaces the live session.
    "unknown session": _row(Expect(201), Expect(404, "session_unknown")),
    # Registration: an exact replay of the superseded session's registration.
    "superseded session": _row(Expect(409, "session_superseded"), Expect(409, "session_superseded")),
    # Registration carries no generation (the server assigns it): the field is refused.
    "wrong generation": _row(Expect(400, "validation_failed"), Expect(409, "session_generation_mismatch")),
    # Claims and lease calls carry no session version: a heartbeat that changed the version
    # does not invalidate them (the run lease has its own version).
    "stale expected version": _row(
        Expect(400, "validation_failed"),
        Expect(409, "session_version_conflict"),
        Expect(409, "session_version_conflict"),
        Expect(409, "session_version_conflict"),
        ALLOWED_OK,
        ALLOWED_OK,
        ALLOWED_OK,
        ALLOWED_OK,
    ),
    "expired session lease": _row(Expect(409, "session_expired"), Expect(409, "session_expired")),
    # Operator drain: new sessions start draining; heartbeats, drain, offline and the work
    # already leased go on; only new claims are refused.
    "worker draining": _row(
        Expect(201),
        ALLOWED_OK,
        ALLOWED_OK,
        ALLOWED_OK,
        Expect(409, "session_draining"),
        ALLOWED_OK,
        ALLOWED_OK,
        ALLOWED_OK,
    ),
    "worker offline": _row(Expect(409, "session_offline"), Expect(409, "session_offline")),
    # Revocation kills the credentials: authentication refuses before any service runs.
    "worker revoked": _row(Expect(401, "credential_revoked"), Expect(401, "credential_revoked")),
    "principal/body mismatch": _row(Expect(403, "principal_mismatch"), Expect(403, "principal_mismatch")),
}

PATHS = {
    "register": wire.SESSION_REGISTER,
    "heartbeat": wire.SESSION_HEARTBEAT,
    "drain": wire.SESSION_DRAIN,
    "offline": wire.SESSION_OFFLINE,
    "claim": wire.CLAIM,
    "ack": wire.LEASE_STARTING,
    "renew": wire.LEASE_RENEW,
    "complete": wire.LEASE_COMPLETE,
}
LEASE_CALLS = ("ack", "renew", "complete")


@dataclass
class World:
    """A worker, its session as the worker last saw it, and (for lease calls) its lease."""

    worker: Any
    session_id: Any
    generation: int
    version: int
    ticket: OfferTicket | None = None
    lease: RunDispatchLease | None = None
    body_changes: dict[str, Any] = field(default_factory=dict)

    def session_fence(self) -> dict[str, Any]:
        return {"sessionId": str(self.session_id), "generation": self.generation}

    def service_fence(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker.worker_id,
            "session_id": self.session_id,
            "generation": self.generation,
        }


def build_world(call: str) -> World:
    worker = enrolled_worker()
    session = register(worker)
    world = World(worker, session.session_id, session.generation, session.version)
    if call == "claim" or call in LEASE_CALLS:
        enqueue(make_revision(command="echo matrix"))
    if call in LEASE_CALLS:
        world.ticket = OfferTicket()
        offers = lease_claim(
            **world.service_fence(), offers=[OfferRequest(world.ticket.offer_id, world.ticket.token)]
        )
        world.lease = offers[0].lease
        lease_fence = {
            **world.service_fence(),
            "attempt_id": world.lease.attempt_id,
            "lease_generation": world.lease.lease_generation,
            "lease_token": world.ticket.token,
        }
        if call in ("renew", "complete"):
            lease_starting(**lease_fence, offer_id=world.ticket.offer_id, lease_version=0)
        if call == "complete":
            lease_running(
                **lease_fence,
                offer_id=world.ticket.offer_id,
                lease_version=0,
                pid=77,
                pgid=77,
                executor_handle="pid=77 pgid=77",
            )
    return world


def body_for(call: str, world: World) -> dict[str, Any]:
    if call == "register":
        return register_body(session_id=world.session_id, **world.body_changes)
    fence = world.session_fence()
    if call == "heartbeat":
        body = {**fence, "expectedVersion": world.version, "availableSlots": 2}
    elif call in ("drain", "offline"):
        body = {**fence, "expectedVersion": world.version}
    elif call == "claim":
        ticket = OfferTicket()
        body = {**fence, "offers": [{"offerId": str(ticket.offer_id), "leaseToken": ticket.token}]}
    else:
        body = {
            **fence,
            "attemptId": str(world.lease.attempt_id),
            "leaseGeneration": world.lease.lease_generation,
            "leaseToken": world.ticket.token,
        }
        if call == "ack":
            body.update(offerId=str(world.ticket.offer_id), leaseVersion=0)
        elif call == "renew":
            body.update(leaseVersion=0)
        else:
            body.update(sequence=1, outcome="succeeded", exitCode=0, stdoutTail="", stderrTail="")
    return {**body, **world.body_changes}


def current_version(world: World) -> int:
    return WorkerSession.objects.get(pk=world.session_id).version


def apply_fault(fault: str, call: str, world: World, capture_on_commit) -> None:
    """Put the world into the fault. Time moves by moving the session's lease expiry, not by sleeping."""
    worker_id = world.worker.worker_id
    if fault == "unknown session":
        world.session_id = uuid7()
    elif fault == "superseded session":
        register(world.worker)  # a new process: generation 2 fences the world's session
    elif fault == "wrong generation":
        if call == "register":
            world.body_changes = {"generation": world.generation}
        else:
            world.generation += 1
    elif fault == "stale expected version":
        if call == "register":
            world.body_changes = {"expectedVersion": world.version}
        else:  # a slot change moves the version; the world keeps presenting the old one
            session_heartbeat(**world.service_fence(), expected_version=world.version, available_slots=1)
            assert current_version(world) == world.version + 1
    elif fault == "expired session lease":
        WorkerSession.objects.filter(pk=world.session_id).update(
            lease_expires_at=db_now() - timedelta(seconds=1)
        )
    elif fault == "worker draining":
        worker_drain(worker_id=worker_id, actor="ops")
        if call == "register":
            world.session_id = uuid7()  # the next process start
        else:  # the worker learnt the new version from its heartbeat
            world.version = current_version(world)
    elif fault == "worker offline":
        if call in LEASE_CALLS:
            session_operator_offline(worker_id=worker_id, force=True, actor="ops")
        else:
            session_offline(**world.service_fence(), expected_version=world.version)
    elif fault == "worker revoked":
        with capture_on_commit(execute=True):
            worker_revoke(worker_id=worker_id, actor="ops")
    elif fault == "principal/body mismatch":
        other = enrolled_worker()
        world.body_changes = {"workerId": str(other.worker_id)}
        principal_for(world.worker.credential_id, now=time.time())  # warm the credential cache
    else:
        raise AssertionError(fault)


ALLOWED_CHECKS = {
    ("register", "unknown session"): lambda out: out["state"] == "online" and out["generation"] == 2,
    ("register", "worker draining"): lambda out: out["state"] == "draining" and out["availableSlots"] == 0,
    ("heartbeat", "worker draining"): lambda out: out["state"] == "draining" and out["availableSlots"] == 0,
    ("drain", "worker draining"): lambda out: out["state"] == "draining",
    ("offline", "worker draining"): lambda out: out["state"] == "offline",
    ("claim", "stale expected version"): lambda out: len(out["offers"]) == 1,
    ("ack", "stale expected version"): lambda out: out["status"] == "starting",
    ("ack", "worker draining"): lambda out: out["status"] == "starting",
    ("renew", "stale expected version"): lambda out: out["status"] == "renewed",
    ("renew", "worker draining"): lambda out: out["status"] == "renewed",
    ("complete", "stale expected version"): lambda out: out["outcome"] == "succeeded",
    ("complete", "worker draining"): lambda out: out["outcome"] == "succeeded",
}


def test_every_allowed_cell_has_a_check():
    allowed = {
        (call, fault) for fault, row in MATRIX.items() for call, expect in row.items() if expect.allowed
    }
    assert allowed == set(ALLOWED_CHECKS)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("call", CALLS)
def test_fail_closed_matrix(client, django_capture_on_commit_callbacks, call, fault):
    expect = MATRIX[fault][call]
    world = build_world(call)
    apply_fault(fault, call, world, django_capture_on_commit_callbacks)
    body = body_for(call, world)
    api = SignedClient(client, world.worker)

    before = snapshot_rows()
    with CaptureQueriesContext(connection) as queries:
        answer = api.post(PATHS[call], body)
    out = answer.json()

    assert answer.status_code == expect.status, out
    if expect.allowed:
        assert "code" not in out, out
        assert ALLOWED_CHECKS[(call, fault)](out), out
        return
    assert out["code"] == expect.code, out
    assert set(out) <= {"code", "message", "field", "details"} and out["message"]
    assert snapshot_rows() == before, "a refused call wrote something"
    if fault == "principal/body mismatch":
        # ADR-0012 §1: refused before any repository access.
        assert repository_queries(queries) == []
    if expect.code == "validation_failed":
        assert out["field"] == next(iter(world.body_changes))


def test_fence_refuses_a_revoked_worker_whose_credential_slipped_through():
    """Defence in depth behind authentication: the fence itself refuses a revoked worker."""
    world = build_world("heartbeat")
    worker_revoke(worker_id=world.worker.worker_id, actor="ops")
    before = snapshot_rows()

    for call in (
        lambda: session_heartbeat(**world.service_fence(), expected_version=world.version, available_slots=2),
        lambda: session_drain(**world.service_fence(), expected_version=world.version),
        lambda: session_offline(**world.service_fence(), expected_version=world.version),
        lambda: lease_claim(**world.service_fence(), offers=[OfferRequest(uuid7(), OfferTicket().token)]),
    ):
        with pytest.raises(DomainError) as refused:
            call()
        assert (refused.value.code, refused.value.status) == ("worker_revoked", 403)
    assert snapshot_rows() == before


# --- the documented table ----------------------------------------------------------------------

CELL = re.compile(r"^(?:\*\*allowed\*\* )?(\d{3})(?: `([a-z_]+)`)?")


def docs_matrix() -> dict[str, dict[str, Expect]]:
    """Parse the fail-closed table of docs/sessions.md into the shape of MATRIX."""
    text = DOCS.read_text()
    section = text.split("<!-- matrix:start -->", 1)[1].split("<!-- matrix:end -->", 1)[0]
    rows = [
        line.strip().strip("|").split("|") for line in section.strip().splitlines() if line.startswith("|")
    ]
    header = [cell.strip().lower() for cell in rows[0]]
    assert header[1:] == list(CALLS), header
    parsed: dict[str, dict[str, Expect]] = {}
    for cells in rows[2:]:
        fault = cells[0].strip().lower()
        parsed[fault] = {}
        for call, cell in zip(CALLS, cells[1:], strict=True):
            match = CELL.match(cell.strip())
            assert match, f"unparsable cell {cell!r} ({fault}, {call})"
            allowed = cell.strip().startswith("**allowed**")
            assert allowed == (match.group(2) is None), f"cell {cell!r}: allowed cells carry no code"
            parsed[fault][call] = Expect(int(match.group(1)), match.group(2))
    return parsed


def test_docs_table_is_the_matrix():
    assert docs_matrix() == MATRIX


def test_every_refusal_code_is_catalogued_with_its_status():
    for row in MATRIX.values():
        for expect in row.values():
            if not expect.allowed:
                assert CATALOGUE[expect.code].status == expect.status


# --- precedence when several faults hold at once -----------------------------------------------

#: The fence's order (docs/sessions.md): the first fault that holds names the refusal.
ORDER = ("revoked", "unknown", "superseded", "offline", "expired", "generation", "version", "draining")
ORDER_CODES = {
    "revoked": "worker_revoked",
    "unknown": "session_unknown",
    "superseded": "session_superseded",
    "offline": "session_offline",
    "expired": "session_expired",
    "generation": "session_generation_mismatch",
    "version": "session_version_conflict",
    "draining": "session_draining",
}
STATE_FAULTS = {"superseded", "offline", "draining"}  # each sets the session state: never two at once


@pytest.mark.parametrize(
    ("first", "second"),
    [(a, b) for i, a in enumerate(ORDER) for b in ORDER[i + 1 :] if not {a, b} <= STATE_FAULTS],
)
def test_fence_checks_in_documented_order(first, second):
    now = db_now()
    worker = Worker(name="order", state=WorkerState.ACTIVE)
    session = WorkerSession(
        worker=worker,
        generation=1,
        version=0,
        state=SessionState.ONLINE,
        lease_expires_at=now + timedelta(seconds=30),
    )
    call = {"generation": 1, "expected_version": 0, "now": now, "purpose": Purpose.CLAIM}
    for fault in (second, first):  # "unknown" drops the row, so the later fault goes first
        if fault == "revoked":
            worker.state = WorkerState.REVOKED
        elif fault == "unknown":
            session = None
        elif fault in STATE_FAULTS:
            session.state = {
                "superseded": SessionState.FENCED,
                "offline": SessionState.OFFLINE,
                "draining": SessionState.DRAINING,
            }[fault]
        elif fault == "expired":
            session.lease_expires_at = now - timedelta(seconds=1)
        elif fault == "generation":
            call["generation"] = 2
        elif fault == "version":
            call["expected_version"] = 5
    with pytest.raises(DomainError) as refused:
        check_session(worker, session, **call)
    assert refused.value.code == ORDER_CODES[first]
