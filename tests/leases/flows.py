"""Service-level lease flows for tests: claim, ACK, renew, complete, and moving lease time.

Time is moved the house way: by setting the database's notion of a lease's expiry
or a run's next-attempt time relative to the database clock, never by sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from actions.leases.activation import lease_running, lease_starting
from actions.leases.claims import OfferRequest, lease_claim
from actions.leases.completion import Completion, CompletionResult, lease_complete
from actions.leases.renewal import lease_release, lease_renew
from audit.models import Event
from core.db import db_now
from leases.fence import AckResult
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.helpers import OfferTicket, Session


@dataclass
class Held:
    """One offer as the worker holds it: its ticket (offer id + token) and the lease fields."""

    session: Session
    ticket: OfferTicket
    attempt_id: Any
    lease_generation: int
    lease_version: int
    execution: dict[str, Any] = field(default_factory=dict)
    run_id: Any = None

    def fence(self, **changes: Any) -> dict[str, Any]:
        base = {
            "worker_id": self.session.worker.worker_id,
            "session_id": self.session.session_id,
            "generation": self.session.generation,
            "attempt_id": self.attempt_id,
            "lease_generation": self.lease_generation,
            "lease_token": self.ticket.token,
        }
        return {**base, **changes}

    def wire_fence(self) -> dict[str, Any]:
        """Both fences as a lease call's body spells them (``sessionId`` … ``leaseToken``)."""
        return {
            **self.session.fence(),
            "attemptId": str(self.attempt_id),
            "leaseGeneration": self.lease_generation,
            "leaseToken": self.ticket.token,
        }

    def lease(self) -> RunDispatchLease:
        return RunDispatchLease.objects.get(
            attempt_id=self.attempt_id, lease_generation=self.lease_generation
        )

    def attempt(self) -> RunAttempt:
        return RunAttempt.objects.get(pk=self.attempt_id)


def claim(session: Session, count: int = 1) -> list[Held]:
    tickets = [OfferTicket() for _ in range(count)]
    offers = lease_claim(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        offers=[OfferRequest(t.offer_id, t.token) for t in tickets],
    )
    by_offer = {t.offer_id: t for t in tickets}
    return [
        Held(
            session,
            by_offer[o.lease.offer_id],
            o.lease.attempt_id,
            o.lease.lease_generation,
            o.lease.version,
            o.execution,
            o.lease.run_id,
        )
        for o in offers
    ]


def claim_one(session: Session) -> Held:
    held = claim(session)
    assert len(held) == 1, "expected one offer"
    return held[0]


def starting(held: Held) -> AckResult:
    return lease_starting(**held.fence(), offer_id=held.ticket.offer_id, lease_version=held.lease_version)


def running(held: Held, pid: int = 4242) -> AckResult:
    return lease_running(
        **held.fence(),
        offer_id=held.ticket.offer_id,
        lease_version=held.lease_version,
        pid=pid,
        pgid=pid,
        executor_handle=f"pid={pid} pgid={pid}",
    )


def start(held: Held, pid: int = 4242) -> Held:
    """Starting then running ACK: the attempt runs."""
    starting(held)
    running(held, pid)
    return held


def renew(held: Held) -> AckResult:
    result = lease_renew(**held.fence(), lease_version=held.lease_version)
    held.lease_version = result.lease.version
    return result


def release(held: Held) -> AckResult:
    return lease_release(**held.fence(), lease_version=held.lease_version)


def completion(
    outcome: str = "succeeded", exit_code: int | None = 0, sequence: int = 1, stdout: str = "ok\n"
) -> Completion:
    return Completion(sequence=sequence, outcome=outcome, exit_code=exit_code, stdout_tail=stdout)


def complete(
    held: Held, outcome: str = "succeeded", exit_code: int | None = 0, sequence: int = 1, stdout: str = "ok\n"
) -> CompletionResult:
    return lease_complete(**held.fence(), completion=completion(outcome, exit_code, sequence, stdout))


def expire_lease(attempt_id, seconds_ago: float = 1.0) -> None:
    """Make the attempt's active lease lapse ``seconds_ago`` by the database clock (and its
    projection on the attempt, which the queue reads)."""
    past = db_now() - timedelta(seconds=seconds_ago)
    changed = RunDispatchLease.objects.filter(attempt_id=attempt_id, state="leased").update(expires_at=past)
    assert changed == 1, "no active lease to expire"
    RunAttempt.objects.filter(pk=attempt_id).update(lease_expires_at=past)


def make_retry_due(run_id) -> None:
    """Bring a retry_wait run's absolute next-attempt time to the database's now."""
    changed = Run.objects.filter(pk=run_id, state="retry_wait").update(
        next_attempt_at=db_now() - timedelta(seconds=1)
    )
    assert changed == 1, "the run is not waiting for a retry"


def lease_rows() -> tuple:
    """Every lease, attempt and run row and the number of events: what a refused call leaves alone."""
    return (
        list(RunDispatchLease.objects.order_by("pk").values()),
        list(RunAttempt.objects.order_by("pk").values()),
        list(Run.objects.order_by("pk").values()),
        Event.objects.count(),
    )
