"""Run lease write paths: claim, activation ACKs, renew, release, completion, expiry (ADR-0012 §3).

Every public function is one transaction (``qinglong.db.write_path``). Each locks the worker row,
reads the database clock after the lock, passes the session fence (``workers.fence``), then locks
the run row (global order: worker → run → attempt → lease, ``workers.locks``) and checks the
lease fence: the presented token against the stored digest (constant time), the lease
generation, the session and generation that claimed it, its state and its expiry. A refused call
writes nothing. Every attempt write happens under its run's row lock; every lease write under its
worker's row lock (the expiry sweep takes the same locks), so the compare-and-swap updates below
can only miss when a bug broke that discipline — they then abort with a conflict code.

Lease life (docs/leases.md): claim (attempt stays ``claimed``, lease expiry = DB now + dispatch
timeout) → starting ACK (attempt ``starting``, expiry = now + run lease TTL) → running ACK
(attempt and run ``running``) → renewals (version + 1, expiry = now + TTL) → completion (lease
``completed``). A lapse is settled by ``leases.settlement``.
"""

from __future__ import annotations

import hashlib
import logging
import random
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import rfc8785
from django.db.models import F, Q

from audit.models import ActorType
from audit.recorder import record
from placement.matching import match
from placement.ranking import ClaimRanking
from placement.selectors import parse_capabilities, parse_placement
from protocol.wire import MAX_OFFERS_PER_CLAIM
from qinglong.conf import protocol
from qinglong.db import db_now, write_path
from qinglong.errors import DomainError
from runs.locks import lock_candidates, lock_run
from runs.models import Run, RunAttempt, TaskRevision
from runs.outcomes import conclude_attempt
from runs.selectors import QUEUE_PAGE, placement_class_heads, waiting_placement_classes
from runs.states import AttemptState, RunState
from runs.transitions import bump_run, move_attempt, move_run, update_attempt
from workers.fence import Purpose, fence_session
from workers.locks import lock_worker
from workers.models import SessionState, Worker, WorkerSession

from .models import LeaseState, ReleaseReason, RunDispatchLease
from .offers import Offer, execution_spec, spec_sha256
from .settlement import settle_lease
from .tokens import TOKEN, token_digest, token_matches

log = logging.getLogger(__name__)

#: Refusals of a sweep's single-item transaction that the next cycle may not meet again.
TRANSIENT_CODES = ("lock_timeout", "storage_busy")

#: Keyset pages of candidates one claim may read (the first one small, then 64 attempts each).
CLAIM_MAX_PAGES = 4
CLAIM_FIRST_PAGE = 16
#: Matching placement classes whose queue heads one claim probes.
CLAIM_MAX_CLASSES = 32


def _renew_interval() -> int:
    """Workers renew at the lease's midpoint (RFC §7.6), at least every second."""
    return max(1, protocol().run_lease_seconds // 2)


@dataclass(frozen=True)
class OfferRequest:
    """A worker's request for one offer: its own offer id (UUID) and lease token (≥128 bits)."""

    offer_id: uuid.UUID
    lease_token: str


def _check_offers(offers: list[OfferRequest]) -> None:
    """Shape rules the wire serializer also enforces, kept here so that no caller can skip them."""
    if not 1 <= len(offers) <= MAX_OFFERS_PER_CLAIM:
        raise DomainError("validation_failed", f"1 to {MAX_OFFERS_PER_CLAIM} offers", field="offers")
    seen_ids: set[uuid.UUID] = set()
    seen_tokens: set[str] = set()
    for index, request in enumerate(offers):
        if not isinstance(request.offer_id, uuid.UUID):
            raise DomainError("validation_failed", "must be a UUID", field=f"offers[{index}].offerId")
        if not isinstance(request.lease_token, str) or not TOKEN.match(request.lease_token):
            raise DomainError("validation_failed", "must be base64url of at least 128 bits",
                              field=f"offers[{index}].leaseToken")
        if request.offer_id in seen_ids:
            raise DomainError("validation_failed", "an offer id appears twice in one claim",
                              field=f"offers[{index}].offerId")
        if request.lease_token in seen_tokens:
            raise DomainError("validation_failed", "a lease token appears twice in one claim",
                              field=f"offers[{index}].leaseToken")
        seen_ids.add(request.offer_id)
        seen_tokens.add(request.lease_token)


# --- claim ---------------------------------------------------------------------------------------


def _candidate_pages(now: datetime, wanted: int, snapshot: dict) -> Iterator[tuple[list[RunAttempt], dict[str, int]]]:
    """Pages of claimable attempts this worker's capabilities admit, in dispatch order.

    The queue is probed per placement class (``runs.selectors``): find the classes waiting (one
    index probe each, at most 256, from a random point so that all are reached in turn), keep
    those the snapshot matches (at most 32 per claim, sampled), and read the head of each. So a
    claim reaches work its worker can run however much work it cannot run waits ahead — the cost
    is a bounded number of index probes, never a scan of the backlog. Yields each page with the
    placement score per matching class. The first page is sized for what the claim wants (a few
    rows past the head, where concurrent claimers contend), later ones 64.
    """
    classes = waiting_placement_classes(start=secrets.token_hex(2))
    if not classes:
        return
    texts = dict(
        TaskRevision.objects.filter(placement_sha256__in=classes)
        .order_by()
        .values_list("placement_sha256", "placement")
        .distinct()
    )
    scores: dict[str, int] = {}
    for sha, text in texts.items():
        fit = match(snapshot, parse_placement(sha, text))
        if fit.eligible:
            scores[sha] = fit.score
    if not scores:
        return
    probed = list(scores) if len(scores) <= CLAIM_MAX_CLASSES else random.sample(list(scores), CLAIM_MAX_CLASSES)
    cursor = None
    size = min(QUEUE_PAGE, max(CLAIM_FIRST_PAGE, 4 * wanted))
    for _ in range(CLAIM_MAX_PAGES):
        page = placement_class_heads(now=now, classes=probed, size=size, after=cursor)
        yield page, scores
        if len(page) < size:
            return
        last = page[-1]
        cursor = (last.priority, last.ready_at, last.pk)
        size = QUEUE_PAGE


def _claimable(attempt: RunAttempt, run: Run, now: datetime) -> bool:
    """Whether a locked candidate may be claimed now (re-checked under its run's row lock)."""
    return (
        attempt.state == AttemptState.CLAIMED
        and run.cancel_requested_at is None
        and run.state in (RunState.QUEUED, RunState.DISPATCHING)
        and (attempt.lease_expires_at is None or attempt.lease_expires_at <= now)
    )


def _replay(lease: RunDispatchLease, request: OfferRequest, session: WorkerSession, index: int,
            now: datetime) -> Offer:
    if (
        not token_matches(request.lease_token, lease.token_digest, worker_id=lease.worker_id)
        or lease.session_id != session.pk
    ):
        raise DomainError(
            "lease_offer_conflict", "this offer id was claimed with another token or session",
            field=f"offers[{index}].offerId",
        )
    _require_active(lease, now, field=f"offers[{index}].offerId")
    spec = execution_spec(lease.run, lease.attempt)
    if spec_sha256(spec) != lease.spec_sha256:
        # The pinned revision is immutable, so this cannot drift; if it ever does, fail closed.
        raise DomainError("lease_offer_conflict", "the offer no longer rebuilds identically",
                          field=f"offers[{index}].offerId")
    return Offer(lease=lease, execution=spec, status="idempotent", renew_interval_seconds=_renew_interval())


def _create_lease(worker: Worker, session: WorkerSession, run: Run, attempt: RunAttempt, request: OfferRequest,
                  now: datetime, score: int) -> Offer:
    spec = execution_spec(run, attempt)
    lease = RunDispatchLease.objects.create(
        attempt=attempt,
        run=run,
        worker=worker,
        session=session,
        session_generation=session.generation,
        lease_generation=attempt.lease_generation + 1,
        offer_id=request.offer_id,
        token_digest=token_digest(request.lease_token, worker_id=worker.pk),
        expires_at=now + timedelta(seconds=protocol().dispatch_timeout_seconds),
        spec_sha256=spec_sha256(spec),
        claimed_at=now,
    )
    update_attempt(
        attempt,
        lease_generation=lease.lease_generation,
        lease_expires_at=lease.expires_at,
        worker=worker,
        session_id=session.pk,
    )
    facts = {"lease_generation": lease.lease_generation, "attempt": attempt.number, "score": score}
    if run.state == RunState.QUEUED:
        move_run(run, RunState.DISPATCHING, actor_type=ActorType.WORKER, actor=worker.name, data=facts,
                 placement_summary=None)
    else:  # the same attempt, dispatched again under a new lease generation
        bump_run(run, "run.dispatching", actor_type=ActorType.WORKER, actor=worker.name, data=facts,
                 placement_summary=None)
    record(
        "lease.claimed",
        actor_type=ActorType.WORKER,
        actor=worker.name,
        worker_id=worker.pk,
        session_id=session.pk,
        run_id=run.pk,
        attempt_id=attempt.pk,
        lease_id=lease.pk,
        data={"lease_generation": lease.lease_generation},
    )
    return Offer(lease=lease, execution=spec, status="claimed", renew_interval_seconds=_renew_interval())


@write_path
def lease_claim(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, offers: list[OfferRequest]
) -> list[Offer]:
    """Atomically claim up to ``len(offers)`` runnable attempts for a worker session (worker pull).

    ADR-0012 §3, SIBLINGS §5 (ADR-0108), PRODUCT invariants 4, 5, 7.

    Arguments: ``worker_id`` the authenticated worker (never a body field); ``session_id`` and
    ``generation`` its session fence; ``offers`` 1–8 worker-generated (offer id UUID, lease
    token ≥128 bits of base64url), offer ids and tokens distinct within the request.

    An offer id this worker already claimed is replayed from the durable lease when the token
    and session match (same answer rebuilt from the pinned revision, nothing written) and is a
    ``lease_offer_conflict`` otherwise. New offers are filled from the dispatch queue (priority,
    FIFO, id; keyset pages — the first of 16 (4 per wanted offer, up to 64), then of 64, at most
    4 pages) with attempts whose pinned placement the session's
    capabilities satisfy, never more than the session's free capacity (min(max concurrency,
    available slots) − active leases, counted under the worker lock). Candidate hits are never
    claims: one statement per page locks the runs of the next eligible candidates in queue order
    (``FOR UPDATE OF run SKIP LOCKED``, each only while its run is at the version the page saw, so
    a run another claimer holds or changed is passed over, never waited for), and each attempt is
    re-checked under its run's lock.

    Locks: the worker row (waits up to PostgreSQL ``lock_timeout``), then each candidate's run row.
    Writes per claim: a lease (token digest only, lease generation + 1, expiry = DB now +
    dispatch timeout), the attempt's fence projection (the attempt stays ``claimed``), run →
    ``dispatching`` (or a ``run.dispatching`` fact for a re-dispatch), ``lease.claimed``. An
    unstarted attempt whose lease lapsed is first settled (``dispatch_timeout``) and taken over
    under a new lease generation. Returns the offers (replays first); ``[]`` means no work.

    Raises: ``validation_failed`` (offers shape), fence codes (``session_draining`` unless every
    offer is a replay), ``capacity_exhausted``, ``lease_offer_conflict``, ``lease_released``/
    ``lease_completed``/``lease_expired`` (a replayed offer whose lease ended), ``lock_timeout``.
    """
    _check_offers(offers)
    worker = lock_worker(worker_id)
    now = db_now()
    session = fence_session(
        worker, session_id=session_id, generation=generation, expected_version=None, now=now, purpose=Purpose.LEASE
    )
    answered: list[Offer] = []
    fresh: list[tuple[int, OfferRequest]] = []
    for index, request in enumerate(offers):
        # One read finds both a replay (this offer id) and a reused token (this digest; digests
        # are bound to the worker, so only this worker's leases can match).
        digest = token_digest(request.lease_token, worker_id=worker.pk)
        seen = list(
            RunDispatchLease.objects.select_related("run__revision", "attempt")
            .filter(Q(offer_id=request.offer_id) | Q(token_digest=digest), worker_id=worker.pk)[:2]
        )
        existing = next((lease for lease in seen if lease.offer_id == request.offer_id), None)
        if existing is not None:
            answered.append(_replay(existing, request, session, index, now))
        elif seen:
            raise DomainError(
                "lease_offer_conflict", "this lease token was already used", field=f"offers[{index}].leaseToken"
            )
        else:
            fresh.append((index, request))
    if not fresh:
        return answered
    if session.state == SessionState.DRAINING:
        if answered:
            return answered
        raise DomainError("session_draining", "the session is draining and takes no new runs", field="sessionId")
    active = RunDispatchLease.objects.filter(session_id=session.pk, state=LeaseState.LEASED).count()
    free = min(session.max_concurrent_runs, session.available_slots) - active
    if free <= 0:
        if answered:
            return answered
        raise DomainError(
            "capacity_exhausted",
            f"the session holds {active} active lease(s) of {min(session.max_concurrent_runs, session.available_slots)}",
            details={"activeLeases": active},
        )

    snapshot = parse_capabilities(session.capabilities_sha256, session.capabilities)
    ranking = ClaimRanking(worker, free, now)
    requests = iter(fresh)
    wanted = min(free, len(fresh))
    claimed: list[Offer] = []
    for page, class_scores in _candidate_pages(now, wanted, snapshot):
        eligible: list[RunAttempt] = []
        scores: dict[uuid.UUID, int] = {}
        for attempt in page:
            revision = attempt.run.revision
            score = class_scores[attempt.placement_sha256]
            placement = parse_placement(revision.placement_sha256, revision.placement)
            if ranking.defer(attempt, revision.placement_sha256, placement, score):
                continue
            eligible.append(attempt)
            scores[attempt.pk] = score
        while eligible and len(claimed) < wanted:
            # One statement locks the next claimable runs in queue order, passing over any that
            # another claimer holds or changed since the page was read (never waiting for it).
            locked = lock_candidates(eligible, limit=wanted - len(claimed))
            if not locked:
                break
            for attempt in locked:  # whole rows, read under the run lock
                run = attempt.run
                if not _claimable(attempt, run, now):
                    continue
                if attempt.lease_expires_at is not None:  # an unstarted lease lapsed: take it over
                    lapsed = RunDispatchLease.objects.filter(attempt_id=attempt.pk, state=LeaseState.LEASED).first()
                    if lapsed is not None:
                        settle_lease(lapsed, reason=ReleaseReason.DISPATCH_TIMEOUT, now=now,
                                     actor_type=ActorType.RECONCILER, expired_only=True)
                        attempt.refresh_from_db()
                        run.refresh_from_db()
                        if not _claimable(attempt, run, now):
                            continue
                _, request = next(requests)
                claimed.append(_create_lease(worker, session, run, attempt, request, now, scores[attempt.pk]))
                ranking.claimed_one()
            # Candidates up to the last locked one were locked (and tried) or passed over: go on after it.
            last = next(i for i, a in enumerate(eligible) if a.pk == locked[-1].pk)
            eligible = eligible[last + 1:]
        if len(claimed) == wanted:
            break
    return answered + claimed


# --- the lease fence -----------------------------------------------------------------------------


@dataclass
class _Fenced:
    worker: Worker
    session: WorkerSession
    lease: RunDispatchLease
    run: Run
    attempt: RunAttempt
    now: datetime


def _require_active(lease: RunDispatchLease, now: datetime, field: str | None = None) -> None:
    if lease.state == LeaseState.COMPLETED:
        raise DomainError("lease_completed", "the run lease already completed", field=field)
    if lease.state == LeaseState.RELEASED:
        raise DomainError(
            "lease_released", f"the run lease was released ({lease.release_reason})", field=field,
            details={"reason": lease.release_reason},
        )
    if lease.expires_at <= now:
        raise DomainError("lease_expired", "the run lease lapsed", field=field)


def _fence(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, attempt_id: uuid.UUID, lease_generation: int,
    lease_token: str,
) -> _Fenced:
    """Lock worker then run, and pass the session fence and the lease's identity fence.

    State and expiry are left to the caller (a completed lease may answer an exact replay).
    """
    worker = lock_worker(worker_id)
    now = db_now()
    session = fence_session(
        worker, session_id=session_id, generation=generation, expected_version=None, now=now, purpose=Purpose.LEASE
    )
    lease = RunDispatchLease.objects.filter(
        worker_id=worker.pk, attempt_id=attempt_id, lease_generation=lease_generation
    ).first()
    if lease is None:
        if RunDispatchLease.objects.filter(attempt_id=attempt_id, worker_id=worker.pk).exists():
            raise DomainError("lease_generation_mismatch", "no lease of this generation", field="leaseGeneration")
        raise DomainError("lease_unknown", "no such run lease for this worker", field="attemptId")
    run = lock_run(lease.run_id)
    lease.refresh_from_db()
    if not token_matches(lease_token, lease.token_digest, worker_id=worker.pk):
        raise DomainError("lease_token_mismatch", "the lease token does not match", field="leaseToken")
    if lease.session_id != session.pk or lease.session_generation != generation:
        raise DomainError("lease_session_mismatch", "the lease belongs to another session", field="sessionId")
    attempt = RunAttempt.objects.get(pk=lease.attempt_id)
    run.revision  # noqa: B018 - load the pinned revision once, for outcome decisions
    return _Fenced(worker=worker, session=session, lease=lease, run=run, attempt=attempt, now=now)


def _lease_cas(lease: RunDispatchLease, what: str, *, bump: bool = False, **fields) -> None:
    """Write ``fields`` on an active lease only if it is still the lease this transaction read
    (state, version, unexpired); raise ``lease_version_conflict`` if it is not."""
    if bump:
        fields["version"] = F("version") + 1
    changed = RunDispatchLease.objects.filter(
        pk=lease.pk, state=LeaseState.LEASED, version=lease.version, expires_at=lease.expires_at
    ).update(**fields)
    if changed != 1:
        raise DomainError("lease_version_conflict", f"the lease changed under {what}", field="leaseVersion")


def _check_version(lease: RunDispatchLease, expected: int) -> None:
    if lease.version != expected:
        raise DomainError(
            "lease_version_conflict",
            f"expected lease version {expected}, the lease is at {lease.version}",
            field="leaseVersion",
            details={"currentVersion": lease.version},
        )


@dataclass(frozen=True)
class AckResult:
    """Answer to starting/running ACKs and renewals."""

    status: str
    lease: RunDispatchLease
    cancel_requested: bool
    renew_interval_seconds: int


# --- activation ----------------------------------------------------------------------------------


@write_path
def lease_starting(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, attempt_id: uuid.UUID, lease_generation: int,
    lease_token: str, offer_id: uuid.UUID, lease_version: int,
) -> AckResult:
    """Starting ACK: the worker accepted the offer (ADR-0012 §3, SIBLINGS §3). Attempt claimed → starting.

    Arguments: the session fence, the lease fence (``attempt_id``, ``lease_generation`` ≥ 1,
    ``lease_token``), the ``offer_id`` the lease was claimed with and the ``lease_version`` the
    worker holds. Locks worker, then run. Writes: attempt → ``starting`` (+ ``attempt.starting``,
    its lease-expiry projection), the lease's ``starting_at`` and expiry, moved from the dispatch
    timeout to DB now + run lease TTL; the lease version does not change (only renewals bump it).
    Repeating the ACK answers ``already_starting`` (or ``already_running``) and writes nothing.
    A lease whose dispatch timeout lapsed refuses it (``lease_expired``, or ``lease_released``
    once swept): the timeout's outcome stands. ``cancel_requested`` tells the worker not to start
    (it then sends the ``cancelled`` start failure).

    Raises: fence codes, ``lease_offer_conflict``, ``lease_version_conflict``, ``lease_expired``,
    ``lease_released``, ``lease_completed``, ``lock_timeout``.
    """
    ctx = _fence(worker_id=worker_id, session_id=session_id, generation=generation, attempt_id=attempt_id,
                 lease_generation=lease_generation, lease_token=lease_token)
    lease, attempt = ctx.lease, ctx.attempt
    if lease.offer_id != offer_id:
        raise DomainError("lease_offer_conflict", "the offer id does not match the lease", field="offerId")
    _require_active(lease, ctx.now)
    _check_version(lease, lease_version)
    cancel = ctx.run.cancel_requested_at is not None
    if attempt.state in (AttemptState.STARTING, AttemptState.RUNNING):
        return AckResult(f"already_{attempt.state}", lease, cancel, _renew_interval())
    expires = ctx.now + timedelta(seconds=protocol().run_lease_seconds)
    _lease_cas(lease, "the starting ACK", starting_at=ctx.now, expires_at=expires)
    move_attempt(attempt, AttemptState.STARTING, actor_type=ActorType.WORKER, actor=ctx.worker.name,
                 data={"lease_generation": lease.lease_generation}, lease_expires_at=expires)
    lease.starting_at, lease.expires_at = ctx.now, expires
    return AckResult("starting", lease, cancel, _renew_interval())


MAX_HANDLE = 512


@write_path
def lease_running(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, attempt_id: uuid.UUID, lease_generation: int,
    lease_token: str, offer_id: uuid.UUID, lease_version: int, pid: int, pgid: int | None, executor_handle: str,
) -> AckResult:
    """Running ACK: the executor owns a process (ADR-0012 §3, SIBLINGS §3). Attempt and run → running.

    Arguments as :func:`lease_starting`, plus ``pid`` (1–2³¹−1), ``pgid`` (the process group the
    worker kills on cancel, or None) and ``executor_handle`` (≤512 characters, e.g.
    ``pid=41 pgid=41 start=…``). Locks worker, then run. Writes: attempt → ``running`` with the
    handle and ``started_at`` = DB time, run → ``running``, the lease's ``running_at``, events
    ``attempt.running`` and ``run.running``. A repeated ACK with the same handle answers
    ``already_running`` and writes nothing; a different handle is ``executor_handle_mismatch``
    (the handle is checked the same way on every later ACK); without a prior starting ACK it is
    ``attempt_not_started``.

    Raises: as :func:`lease_starting`, plus ``validation_failed`` (handle too long),
    ``executor_handle_mismatch``, ``attempt_not_started``.
    """
    if len(executor_handle) > MAX_HANDLE:
        raise DomainError("validation_failed", f"at most {MAX_HANDLE} characters", field="executorHandle")
    ctx = _fence(worker_id=worker_id, session_id=session_id, generation=generation, attempt_id=attempt_id,
                 lease_generation=lease_generation, lease_token=lease_token)
    lease, attempt, run = ctx.lease, ctx.attempt, ctx.run
    if lease.offer_id != offer_id:
        raise DomainError("lease_offer_conflict", "the offer id does not match the lease", field="offerId")
    _require_active(lease, ctx.now)
    _check_version(lease, lease_version)
    cancel = run.cancel_requested_at is not None
    if attempt.state == AttemptState.RUNNING:
        if (attempt.pid, attempt.pgid, attempt.executor_handle) != (pid, pgid, executor_handle):
            raise DomainError("executor_handle_mismatch", "the attempt runs under another handle",
                              field="executorHandle")
        return AckResult("already_running", lease, cancel, _renew_interval())
    if attempt.state != AttemptState.STARTING:
        raise DomainError("attempt_not_started", "send the starting ACK first", field="attemptId")
    _lease_cas(lease, "the running ACK", running_at=ctx.now)
    move_attempt(attempt, AttemptState.RUNNING, actor_type=ActorType.WORKER, actor=ctx.worker.name,
                 started_at=ctx.now, pid=pid, pgid=pgid, executor_handle=executor_handle)
    move_run(run, RunState.RUNNING, actor_type=ActorType.WORKER, actor=ctx.worker.name, started_at=ctx.now,
             data={"attempt": attempt.number})
    lease.running_at = ctx.now
    return AckResult("running", lease, cancel, _renew_interval())


START_FAILURES = {
    "executor_start_failed": AttemptState.FAILED,
    "cancelled": AttemptState.CANCELLED,
    "timed_out": AttemptState.TIMED_OUT,
}


@write_path
def lease_start_failed(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, attempt_id: uuid.UUID, lease_generation: int,
    lease_token: str, offer_id: uuid.UUID, lease_version: int, reason: str,
) -> AckResult:
    """The worker could not (or must not) start the attempt: end it in one transaction (SIBLINGS §3).

    Arguments as :func:`lease_starting`, plus ``reason``: ``executor_start_failed`` → failed
    (retried per the revision's ``retry_on``), ``cancelled`` → cancelled (only when the run has a
    cancellation request, which the starting ACK or a heartbeat reported), ``timed_out`` → timed
    out. Allowed from ``starting`` (and from ``claimed`` for ``cancelled``). Locks worker, then
    run. Writes together: lease ``completed`` (version + 1, completion sequence 0), attempt
    terminal, run terminal or ``retry_wait``, their events. A resend after a lost answer (same
    expected version, same reason) replays the answer and writes nothing; anything else on a
    completed lease is ``lease_completed``.

    Raises: as :func:`lease_starting`, plus ``validation_failed`` (reason), ``cancel_not_requested``,
    ``attempt_not_started``/``attempt_already_started``.
    """
    if reason not in START_FAILURES:
        raise DomainError("validation_failed", f"must be one of {', '.join(START_FAILURES)}", field="reason")
    outcome = START_FAILURES[reason]
    ctx = _fence(worker_id=worker_id, session_id=session_id, generation=generation, attempt_id=attempt_id,
                 lease_generation=lease_generation, lease_token=lease_token)
    lease, attempt, run = ctx.lease, ctx.attempt, ctx.run
    if lease.offer_id != offer_id:
        raise DomainError("lease_offer_conflict", "the offer id does not match the lease", field="offerId")
    if (
        lease.state == LeaseState.COMPLETED
        and lease.completion_sequence == 0
        and lease.completion_outcome == outcome
        and lease.version == lease_version + 1
    ):
        return AckResult("start_failed", lease, run.cancel_requested_at is not None, _renew_interval())
    _require_active(lease, ctx.now)
    _check_version(lease, lease_version)
    if not (attempt.state == AttemptState.STARTING or (attempt.state == AttemptState.CLAIMED
                                                       and outcome == AttemptState.CANCELLED)):
        raise DomainError("attempt_already_started" if attempt.state == AttemptState.RUNNING else "attempt_not_started",
                          f"a start failure cannot end a {attempt.state} attempt", field="attemptId")
    if outcome == AttemptState.CANCELLED and run.cancel_requested_at is None:
        raise DomainError("cancel_not_requested", "nobody asked to cancel this run; release the lease instead",
                          field="reason")
    _lease_cas(lease, "the start failure", bump=True, state=LeaseState.COMPLETED, ended_at=ctx.now,
               completion_sequence=0, completion_outcome=outcome)
    lease.refresh_from_db()
    conclude_attempt(run, attempt, outcome, now=ctx.now, actor_type=ActorType.WORKER, actor=ctx.worker.name,
                     reason=reason)
    return AckResult("start_failed", lease, run.cancel_requested_at is not None, _renew_interval())


# --- renew, release ------------------------------------------------------------------------------


@write_path
def lease_renew(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, attempt_id: uuid.UUID, lease_generation: int,
    lease_token: str, lease_version: int,
) -> AckResult:
    """Extend a started attempt's lease (ADR-0012 §3, SIBLINGS §6 "Renew CASes lease version and projection").

    Arguments: the session fence, the lease fence and ``lease_version`` (the version the worker
    holds, ≥ 0). Locks worker, then run. Writes: a compare-and-swap on (lease state, version,
    expiry) setting expiry = DB now + ``RUN_LEASE_SECONDS`` and version + 1, and the attempt's
    expiry projection. Answers the new version and expiry and whether the run has a cancellation
    request (the worker then kills the process group and completes ``cancelled``). Renewing an
    unstarted lease is ``attempt_not_started`` (the dispatch timeout bounds that phase); a lapsed
    lease cannot be renewed (``lease_expired``, ``lease_released`` once swept).

    Raises: fence codes, ``lease_version_conflict``, ``lease_expired``, ``lease_released``,
    ``lease_completed``, ``attempt_not_started``, ``lock_timeout``.
    """
    ctx = _fence(worker_id=worker_id, session_id=session_id, generation=generation, attempt_id=attempt_id,
                 lease_generation=lease_generation, lease_token=lease_token)
    lease = ctx.lease
    _require_active(lease, ctx.now)
    _check_version(lease, lease_version)
    if ctx.attempt.state not in (AttemptState.STARTING, AttemptState.RUNNING):
        raise DomainError("attempt_not_started", "send the starting ACK first", field="attemptId")
    expires = ctx.now + timedelta(seconds=protocol().run_lease_seconds)
    _lease_cas(lease, "the renewal", bump=True, expires_at=expires)
    update_attempt(ctx.attempt, lease_expires_at=expires)
    lease.expires_at, lease.version = expires, lease_version + 1
    return AckResult("renewed", lease, ctx.run.cancel_requested_at is not None, _renew_interval())


@write_path
def lease_release(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, attempt_id: uuid.UUID, lease_generation: int,
    lease_token: str, lease_version: int,
) -> AckResult:
    """Hand back an attempt that has not started (ADR-0012 §3); it returns to the queue.

    Arguments: the session fence, the lease fence and ``lease_version``. Locks worker, then run.
    Writes: lease ``released`` (``worker_release``, version + 1), the attempt's projection cleared
    (it stays ``claimed`` under the same number and queue position — a release consumes no try),
    ``lease.released``; if the run has a cancellation request the attempt and run are cancelled
    instead. The next claim of the attempt uses a new lease generation.

    Raises: fence codes, ``lease_version_conflict``, ``lease_expired``, ``lease_released``,
    ``lease_completed``, ``attempt_already_started``, ``lock_timeout``.
    """
    ctx = _fence(worker_id=worker_id, session_id=session_id, generation=generation, attempt_id=attempt_id,
                 lease_generation=lease_generation, lease_token=lease_token)
    _require_active(ctx.lease, ctx.now)
    _check_version(ctx.lease, lease_version)
    if ctx.attempt.state != AttemptState.CLAIMED:
        raise DomainError("attempt_already_started", "a started attempt cannot be released", field="attemptId")
    if not settle_lease(ctx.lease, reason=ReleaseReason.WORKER_RELEASE, now=ctx.now, actor_type=ActorType.WORKER,
                        actor=ctx.worker.name, observed_version=lease_version):
        raise DomainError("lease_version_conflict", "the lease changed under the release", field="leaseVersion")
    ctx.lease.refresh_from_db()
    return AckResult("released", ctx.lease, ctx.run.cancel_requested_at is not None, _renew_interval())


# --- completion ----------------------------------------------------------------------------------

OUTCOMES = (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.TIMED_OUT, AttemptState.CANCELLED)


@dataclass(frozen=True)
class Completion:
    """A worker's report of how an attempt ended (tails are bounded UTF-8 text without NUL)."""

    sequence: int
    outcome: str
    exit_code: int | None
    stdout_tail: str = ""
    stderr_tail: str = ""

    def sha256(self) -> str:
        return hashlib.sha256(
            rfc8785.dumps(
                {
                    "sequence": self.sequence,
                    "outcome": self.outcome,
                    "exitCode": self.exit_code,
                    "stdoutTail": self.stdout_tail,
                    "stderrTail": self.stderr_tail,
                }
            )
        ).hexdigest()


@dataclass(frozen=True)
class CompletionResult:
    """The answer to a completion; rebuilt identically from the lease for an exact replay."""

    attempt_id: uuid.UUID
    lease_generation: int
    sequence: int
    outcome: str


@write_path
def lease_complete(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, attempt_id: uuid.UUID, lease_generation: int,
    lease_token: str, completion: Completion,
) -> CompletionResult:
    """Record an attempt's result under both fences, in one transaction (ADR-0012 §3, PRODUCT invariant 6).

    Arguments: the session fence, the lease fence and a :class:`Completion` (sequence ≥ 1,
    outcome succeeded | failed | timed_out | cancelled, exit code −255…255 or None, output
    tails ≤ 8 KiB each). Locks worker, then run. Checks the session fence and the lease fence
    (token digest, lease generation, session and generation, not released, not expired by the DB
    clock), then writes together: lease ``completed`` (version + 1, completion sequence and
    payload digest), attempt terminal (outcome, exit code, output tails), run state (terminal,
    or ``retry_wait`` per the revision's policy; cancellation intent wins) and their events
    (``attempt.<outcome>``, ``run.<state>``, ``lease.completed``). An identical resend (same
    sequence and payload digest) answers the same result and writes nothing; anything else for
    a completed lease is ``lease_completed`` (409). Never a second result. ``succeeded``
    requires exit code 0; ``cancelled`` requires a cancellation request on the run.

    Raises: ``validation_failed``, fence codes, ``lease_completed``, ``lease_released``,
    ``lease_expired``, ``attempt_not_started``, ``cancel_not_requested``, ``lock_timeout``.
    """
    if completion.outcome not in OUTCOMES:
        raise DomainError("validation_failed", f"must be one of {', '.join(OUTCOMES)}", field="outcome")
    if completion.outcome == AttemptState.SUCCEEDED and completion.exit_code != 0:
        raise DomainError("validation_failed", "a succeeded attempt exits with 0", field="exitCode")
    ctx = _fence(worker_id=worker_id, session_id=session_id, generation=generation, attempt_id=attempt_id,
                 lease_generation=lease_generation, lease_token=lease_token)
    lease, attempt, run = ctx.lease, ctx.attempt, ctx.run
    digest = completion.sha256()
    if lease.state == LeaseState.COMPLETED:
        if lease.completion_sequence == completion.sequence and lease.completion_sha256 == digest:
            return CompletionResult(attempt.pk, lease.lease_generation, completion.sequence, lease.completion_outcome)
        raise DomainError("lease_completed", "the run lease already completed with another result")
    _require_active(lease, ctx.now)
    if attempt.state != AttemptState.RUNNING:
        raise DomainError("attempt_not_started", "send the running ACK before completing", field="attemptId")
    if completion.outcome == AttemptState.CANCELLED and run.cancel_requested_at is None:
        # Only an operator's cancellation ends a run cancelled; a worker that stops a job on its
        # own reports failed (or timed_out), and the retry policy decides.
        raise DomainError("cancel_not_requested", "nobody asked to cancel this run; report failed instead",
                          field="outcome")
    _lease_cas(lease, "the completion", bump=True, state=LeaseState.COMPLETED, ended_at=ctx.now,
               completion_sequence=completion.sequence, completion_sha256=digest,
               completion_outcome=completion.outcome)
    conclude_attempt(
        run, attempt, completion.outcome, now=ctx.now, actor_type=ActorType.WORKER, actor=ctx.worker.name,
        exit_code=completion.exit_code, stdout_tail=completion.stdout_tail, stderr_tail=completion.stderr_tail,
    )
    record(
        "lease.completed",
        actor_type=ActorType.WORKER,
        actor=ctx.worker.name,
        worker_id=ctx.worker.pk,
        session_id=ctx.session.pk,
        run_id=run.pk,
        attempt_id=attempt.pk,
        lease_id=lease.pk,
        data={"outcome": completion.outcome, "sequence": completion.sequence},
    )
    return CompletionResult(attempt.pk, lease.lease_generation, completion.sequence, completion.outcome)


# --- expiry --------------------------------------------------------------------------------------


@write_path
def lease_expire(*, lease_id: uuid.UUID, observed_version: int) -> bool:
    """Settle one lapsed lease if it is still lapsed at the version the sweep observed (SIBLINGS §1
    ``expireWithLease``, ADR-0012 "not implemented yet": expiry/lost).

    Arguments: ``lease_id`` and ``observed_version``, one pair from :func:`expired_leases`.
    Locks: the lease's worker row, then its run row (the order every lease write uses). Writes,
    only if its own ``UPDATE … WHERE`` still finds the lease ``leased``, of the same lease
    generation, at the observed version and expired by the DB clock read after the locks:
    unstarted attempt → lease released (``dispatch_timeout``), attempt back in the queue under the
    same number (no try consumed); started attempt → lease released (``lease_expired``), attempt
    and run ``lost``, then ``retry_wait`` with an absolute next-attempt time, ``failed`` or
    ``cancelled`` (``runs.outcomes``). A renewal or completion that committed between the sweep's
    read and this write makes the CAS miss and nothing is written; several sweepers on the same
    lease queue on the worker lock and all but one miss. Returns whether it settled the lease.
    Raises only ``lock_timeout``/``storage_busy``.
    """
    lease = RunDispatchLease.objects.filter(pk=lease_id).first()
    if lease is None:
        return False
    lock_worker(lease.worker_id)
    now = db_now()
    return settle_lease(lease, reason=ReleaseReason.LEASE_EXPIRED, now=now, actor_type=ActorType.RECONCILER,
                        expired_only=True, observed_version=observed_version)


def expired_leases(*, batch: int | None = None) -> list[tuple[uuid.UUID, int]]:
    """(lease id, version) of up to ``batch`` (default ``SWEEP_BATCH``) lapsed active leases,
    oldest expiry first, by the DB clock; served by the partial index ``lease_active_expiry``."""
    now = db_now()
    return list(
        RunDispatchLease.objects.filter(state=LeaseState.LEASED, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("pk", "version")[: batch or protocol().sweep_batch]
    )


def sweep_expired_leases(*, batch: int | None = None) -> int:
    """Settle up to ``batch`` lapsed leases, one transaction each; return how many were settled.

    Called by ``qinglong.sweeps.run_cycle`` (Celery beat, ``manage.py sweep``, ``manage.py serve``).
    Safe with several sweepers at once: each write is a CAS, so at most one settles a lease. A
    lease whose worker row stays locked past the lock timeout (or SQLite stays busy) is left for
    the next cycle; the others in the batch are still settled.
    """
    settled = 0
    for lease_id, version in expired_leases(batch=batch):
        try:
            settled += lease_expire(lease_id=lease_id, observed_version=version)
        except DomainError as exc:
            if exc.code not in TRANSIENT_CODES:
                raise
            log.warning("lease %s not settled this cycle: %s", lease_id, exc.code)
    return settled
