"""Claim: a worker session takes runnable attempts under new run leases (worker pull; ADR-0012 §3, §4).

The rules — offers and their replay, capacity, placement classes, keyset pages, ``SKIP LOCKED``
candidate locking, ranking holds — are in ``docs/leases.md`` (Claim) and ``docs/placement.md``.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import rfc8785
from django.db.models import Q

from audit.models import ActorType
from audit.recorder import record
from core.conf import protocol
from core.db import Bound, bound, call_function, typed_call, write_path
from core.errors import DomainError
from leases.fence import (
    renew_interval,
    require_active,
)
from leases.models import LeaseState, ReleaseReason, RunDispatchLease, lease_loaded
from leases.offers import Offer, execution_spec, spec_sha256
from leases.settlement import settle_lease
from leases.tokens import TOKEN, token_digest, token_matches
from placement.matching import match
from placement.ranking import ClaimRanking
from placement.selectors import parse_capabilities, parse_placement
from protocol.ids import uuid7
from protocol.wire import MAX_OFFERS_PER_CLAIM
from runs.locks import lock_candidates
from runs.models import Run, RunAttempt, TaskRevision
from runs.selectors import QUEUE_PAGE, placement_class_heads, waiting_placement_classes
from runs.states import AttemptState, RunState
from runs.transitions import bump_run, move_run, update_attempt
from workers.fence import Purpose, lock_and_fence
from workers.models import SessionState, Worker, WorkerSession

#: Keyset pages of candidates one claim may read (the first one small, then 64 attempts each).
CLAIM_MAX_PAGES = 4


CLAIM_FIRST_PAGE = 16


#: Matching placement classes whose queue heads one claim probes.
CLAIM_MAX_CLASSES = 32


@dataclass(frozen=True)
class OfferRequest:
    """A worker's request for one offer: its own offer id (UUID) and lease token (≥128 bits)."""

    offer_id: uuid.UUID
    lease_token: str


def check_offers(offers: list[OfferRequest], *, at: str = "offers") -> None:
    """The shape rules of a claim's offers (1 to ``MAX_OFFERS_PER_CLAIM``, UUID offer ids, lease
    tokens of at least 128 bits, no offer id or token twice), kept here so that no caller can skip
    them; the waiting claim runs them before it waits (docs/leases.md, "Waiting claims"), a
    completion's next claim before it completes. ``at``: where the offers are in the body.
    Raises DomainError ``validation_failed`` naming the field (``offers[i].offerId``, …)."""
    if not 1 <= len(offers) <= MAX_OFFERS_PER_CLAIM:
        raise DomainError("validation_failed", f"1 to {MAX_OFFERS_PER_CLAIM} offers", field=at)
    seen_ids: set[uuid.UUID] = set()
    seen_tokens: set[str] = set()
    for index, request in enumerate(offers):
        if not isinstance(request.offer_id, uuid.UUID):
            raise DomainError("validation_failed", "must be a UUID", field=f"{at}[{index}].offerId")
        if not isinstance(request.lease_token, str) or not TOKEN.match(request.lease_token):
            raise DomainError(
                "validation_failed",
                "must be base64url of at least 128 bits",
                field=f"{at}[{index}].leaseToken",
            )
        if request.offer_id in seen_ids:
            raise DomainError(
                "validation_failed",
                "an offer id appears twice in one claim",
                field=f"{at}[{index}].offerId",
            )
        if request.lease_token in seen_tokens:
            raise DomainError(
                "validation_failed",
                "a lease token appears twice in one claim",
                field=f"{at}[{index}].leaseToken",
            )
        seen_ids.add(request.offer_id)
        seen_tokens.add(request.lease_token)


def _candidate_pages(
    now: datetime, wanted: int, snapshot: dict
) -> Iterator[tuple[list[RunAttempt], dict[str, int]]]:
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
    probed = (
        list(scores) if len(scores) <= CLAIM_MAX_CLASSES else random.sample(list(scores), CLAIM_MAX_CLASSES)
    )
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


def _replay(
    lease: RunDispatchLease, request: OfferRequest, session: WorkerSession, index: int, now: datetime
) -> Offer:
    if (
        not token_matches(request.lease_token, lease.token_digest, worker_id=lease.worker_id)
        or lease.session_id != session.pk
    ):
        raise DomainError(
            "lease_offer_conflict",
            "this offer id was claimed with another token or session",
            field=f"offers[{index}].offerId",
        )
    require_active(lease, now, field=f"offers[{index}].offerId")
    spec = execution_spec(lease.run, lease.attempt)
    if spec_sha256(spec) != lease.spec_sha256:
        # The pinned revision is immutable, so this cannot drift; if it ever does, fail closed.
        raise DomainError(
            "lease_offer_conflict",
            "the offer no longer rebuilds identically",
            field=f"offers[{index}].offerId",
        )
    return Offer(lease=lease, execution=spec, status="idempotent", renew_interval_seconds=renew_interval())


def _create_lease(
    worker: Worker,
    session: WorkerSession,
    run: Run,
    attempt: RunAttempt,
    request: OfferRequest,
    now: datetime,
    score: int,
) -> Offer:
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
        move_run(
            run,
            RunState.DISPATCHING,
            actor_type=ActorType.WORKER,
            actor=worker.name,
            data=facts,
            placement_summary=None,
        )
    else:  # the same attempt, dispatched again under a new lease generation
        bump_run(
            run,
            "run.dispatching",
            actor_type=ActorType.WORKER,
            actor=worker.name,
            data=facts,
            placement_summary=None,
        )
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
    return Offer(lease=lease, execution=spec, status="claimed", renew_interval_seconds=renew_interval())


def _claim_first(**call: Any) -> list[Offer] | None:
    """:func:`lease_claim`'s database path (``core.db.write_path``): its arguments, as given."""
    check_offers(call["offers"])
    return _claim_in_database(**call)


@write_path(database_path=_claim_first)
def lease_claim(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, offers: list[OfferRequest]
) -> list[Offer]:
    """Atomically claim up to ``len(offers)`` runnable attempts for a worker session (worker pull).

    ADR-0012 §3, docs/placement.md §5, docs/leases.md, Claim.

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

    PostgreSQL: one round trip that is its own transaction (``ql_lease_claim``, migration leases
    0004, as ``core.db.write_path``'s database path) for every claim the placement classes and
    templates this process knows can answer; everything else is answered by the Python path below.

    Raises: ``validation_failed`` (offers shape), fence codes (``session_draining`` unless every
    offer is a replay), ``capacity_exhausted``, ``lease_offer_conflict``, ``lease_released``/
    ``lease_completed``/``lease_expired`` (a replayed offer whose lease ended), ``lock_timeout``.
    """
    check_offers(offers)
    return _claim_orm(worker_id, session_id, generation, offers)


#: :func:`lease_claim` without its database path (same transaction and retries), for a caller whose
#: own ``ql_lease_claim`` call has just handed the claim to Python (``next_claim``): asking the
#: function again would only repeat its work and its answer.
lease_claim_in_python = write_path(lease_claim.__wrapped__)  # type: ignore[attr-defined]


def _claim_orm(
    worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, offers: list[OfferRequest]
) -> list[Offer]:
    """The claim in Python (SQLite, and every case the PostgreSQL function hands back)."""
    fenced = lock_and_fence(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=None,
        purpose=Purpose.LEASE,
    )
    worker, session, now = fenced.worker, fenced.session, fenced.now
    answered: list[Offer] = []
    fresh: list[tuple[int, OfferRequest]] = []
    for index, request in enumerate(offers):
        # One read finds both a replay (this offer id) and a reused token (this digest; digests
        # are bound to the worker, so only this worker's leases can match).
        digest = token_digest(request.lease_token, worker_id=worker.pk)
        seen = list(
            RunDispatchLease.objects.select_related("run__revision", "attempt").filter(
                Q(offer_id=request.offer_id) | Q(token_digest=digest), worker_id=worker.pk
            )[:2]
        )
        existing = next((lease for lease in seen if lease.offer_id == request.offer_id), None)
        if existing is not None:
            answered.append(_replay(existing, request, session, index, now))
        elif seen:
            raise DomainError(
                "lease_offer_conflict",
                "this lease token was already used",
                field=f"offers[{index}].leaseToken",
            )
        else:
            fresh.append((index, request))
    if not fresh:
        return answered
    if session.state == SessionState.DRAINING:
        if answered:
            return answered
        raise DomainError(
            "session_draining", "the session is draining and takes no new runs", field="sessionId"
        )
    active = RunDispatchLease.objects.filter(session_id=session.pk, state=LeaseState.LEASED).count()
    capacity = min(session.max_concurrent_runs, session.available_slots)
    free = capacity - active
    if free <= 0:
        if answered:
            return answered
        raise DomainError(
            "capacity_exhausted",
            f"the session holds {active} active lease(s) of {capacity}",
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
                    lapsed = RunDispatchLease.objects.filter(
                        attempt_id=attempt.pk, state=LeaseState.LEASED
                    ).first()
                    if lapsed is not None:
                        settle_lease(
                            lapsed,
                            reason=ReleaseReason.DISPATCH_TIMEOUT,
                            now=now,
                            actor_type=ActorType.RECONCILER,
                            expired_only=True,
                        )
                        attempt.refresh_from_db()
                        run.refresh_from_db()
                        if not _claimable(attempt, run, now):
                            continue
                _, request = next(requests)
                claimed.append(_create_lease(worker, session, run, attempt, request, now, scores[attempt.pk]))
                ranking.claimed_one()
            # Candidates up to the last locked one were locked (and tried) or passed over: go on after it.
            last = next(i for i, a in enumerate(eligible) if a.pk == locked[-1].pk)
            eligible = eligible[last + 1 :]
        if len(claimed) == wanted:
            break
    return answered + claimed


# --- PostgreSQL: the claim in one round trip -------------------------------------------------------
#
# ``ql_lease_claim`` (migration leases 0004) does the successful claim on the server. What it needs
# from Python is content-addressed and therefore cached here for the life of the process: a
# session's capability digest (fixed at registration), which placement classes that digest admits
# and with which score (``placement.matching``), and per pinned revision the RFC 8785 text of the
# execution spec with markers where the run id, attempt id and attempt number go (the function
# fills them in and stores the SHA-256, so a replay rebuilds the same digest in Python).

#: Markers in spec templates; random per process, so that no revision's text can contain them.
_RUN_MARKER = uuid.UUID(bytes=secrets.token_bytes(16))
_ATTEMPT_MARKER = uuid.UUID(bytes=secrets.token_bytes(16))
_NUMBER_MARKER = 10**15 + secrets.randbelow(10**15)
_CACHE_LIMIT = 4096
#: A claim sends the spec templates of at most this many revisions, the most recently used; one
#: that meets an attempt of another revision answers ``revision`` and is repeated with it. So a
#: call's size does not grow with the number of revisions the process has seen.
TEMPLATES_PER_CALL = 32
_session_caps: dict[uuid.UUID, tuple[str, str]] = {}
_class_scores: dict[str, dict[str, int | None]] = {}
_templates: dict[uuid.UUID, str | None] = {}
#: What :func:`_known` dumped: the class parameters by the scores, the template parameters by
#: the set of revisions they were dumped from.
_bound_scores: dict[tuple, tuple[Bound, ...]] = {}
_bound_templates: dict[frozenset, tuple[Bound, ...]] = {}
_BOUND_SCORES_LIMIT = 1024
_BOUND_TEMPLATES_LIMIT = 64

#: ``ql_lease_claim``'s argument types (``next_claim`` calls it inside its completion's function too).
CLAIM_TYPES = (
    "uuid, uuid, bigint, uuid[], text[], uuid[], text[], text[], integer[], uuid[], text[], text, interval, "
    "interval, integer, integer, integer, integer, text, text, text"
)
_CLAIM_SQL = typed_call("ql_lease_claim", CLAIM_TYPES)
#: :meth:`FunctionClaim.answered`: the function answered what this process has now learnt; call again.
AGAIN = object()


def _bounded(cache: dict, key, value) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value


def _recent_templates() -> dict[uuid.UUID, str]:
    """The usable templates of the :data:`TEMPLATES_PER_CALL` most recently used revisions.

    Read from a copy (one C-level step under the GIL: another thread may learn, move or clear
    entries meanwhile), newest first, stopping at the bound; the answer of the call is built from
    what this returns."""
    usable = ((k, v) for k, v in reversed(dict(_templates).items()) if v is not None)
    return dict(itertools.islice(usable, TEMPLATES_PER_CALL))


def _used(revision_id: uuid.UUID) -> None:
    """Move ``revision_id``'s template (if cached) to the newest end of the cache."""
    text = _templates.pop(revision_id, None)
    if text is not None:
        _templates[revision_id] = text


def _spec_template(revision_id: uuid.UUID) -> str | None:
    """The canonical execution-spec text of ``revision_id`` with markers, or None if unusable."""
    if revision_id not in _templates:
        revision = TaskRevision.objects.get(pk=revision_id)
        run = Run(id=_RUN_MARKER, task_id=revision.task_id, revision=revision)
        attempt = RunAttempt(id=_ATTEMPT_MARKER, number=_NUMBER_MARKER)
        text = rfc8785.dumps(execution_spec(run, attempt)).decode("utf-8")
        usable = all(
            text.count(str(marker)) == 1 for marker in (_RUN_MARKER, _ATTEMPT_MARKER, _NUMBER_MARKER)
        )
        _bounded(_templates, revision_id, text if usable else None)
        return text if usable else None
    return _templates.get(revision_id)


def _learn_classes(capabilities_sha256: str, capabilities: str, classes: list[str]) -> None:
    """Match the session's snapshot against placement classes not evaluated yet (cached by digest)."""
    snapshot = parse_capabilities(capabilities_sha256, capabilities)
    scores = _class_scores.setdefault(capabilities_sha256, {})
    texts = dict(
        TaskRevision.objects.filter(placement_sha256__in=classes)
        .order_by()
        .values_list("placement_sha256", "placement")
        .distinct()
    )
    if len(scores) >= _CACHE_LIMIT:
        scores.clear()
    for sha in classes:
        fit = match(snapshot, parse_placement(sha, texts[sha])) if sha in texts else None
        scores[sha] = fit.score if fit is not None and fit.eligible else None


def _known(scores: dict[str, int | None], templates: dict[uuid.UUID, str]) -> tuple[Bound, ...]:
    """The claim's five parameters that say what this process knows — the placement classes
    evaluated for the session's capabilities, the allowed ones and their scores, the recent
    revisions' ids and templates — each dumped once per state of that knowledge
    (``core.db.bound``): psycopg would otherwise walk and dump the five arrays on every claim
    (about 6 % of the instructions of a claim → release loop in its process, docs/performance.md).

    The scores are kept by their content (one state per capabilities snapshot the process has
    seen); the templates by the set of revisions (``ql_lease_claim`` looks a template up by its
    revision id, so their order of recent use is not a state). Each store keeps its most recent
    states: :data:`_BOUND_SCORES_LIMIT` (a few class digests each) and
    :data:`_BOUND_TEMPLATES_LIMIT` (up to ``TEMPLATES_PER_CALL`` texts each)."""
    key = tuple(scores.items())
    classes = _bound_scores.get(key)
    if classes is None:
        allowed = [sha for sha, score in scores.items() if score is not None]
        classes = (bound(list(scores)), bound(allowed), bound([scores[sha] for sha in allowed]))
        _keep(_bound_scores, key, classes, _BOUND_SCORES_LIMIT)
    revisions = frozenset(templates)
    texts = _bound_templates.get(revisions)
    if texts is None:
        texts = (bound(list(templates)), bound(list(templates.values())))
        _keep(_bound_templates, revisions, texts, _BOUND_TEMPLATES_LIMIT)
    return (*classes, *texts)


def _keep(store: dict, key, value, limit: int) -> None:
    """``store[key] = value``, the oldest entry evicted first once ``store`` holds ``limit``."""
    while len(store) >= limit:
        try:
            del store[next(iter(store))]
        except (KeyError, RuntimeError, StopIteration):  # another thread changed it meanwhile
            break
    store[key] = value


def _claim_in_database(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, offers: list[OfferRequest]
) -> list[Offer] | None:
    """Claim through ``ql_lease_claim``; None when the Python path must answer (nothing written).

    One statement, its own transaction (``core.db.write_path``). The function returns ``orm``
    for every case it leaves to Python — any refusal, a replayed offer or reused token, a lapsed
    lease to take over, a fresh attempt the claim ranking must weigh — and ``unknown``/
    ``revision`` when this process has not yet evaluated a waiting placement class or templated a
    revision: those are learnt and the call repeated (at most a few times; then Python answers).
    """
    claim = function_claim(worker_id=worker_id, session_id=session_id, generation=generation, offers=offers)
    if claim is None:
        return None
    for _ in range(4):
        (answer,) = call_function(_CLAIM_SQL, claim.params())
        claimed = claim.answered(answer)
        if claimed is not AGAIN:
            return claimed  # type: ignore[return-value]
    return None


def function_claim(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, offers: list[OfferRequest]
) -> FunctionClaim | None:
    """A claim to make through ``ql_lease_claim`` (PostgreSQL), or None when the session is not
    found (the Python path answers). Arguments as :func:`lease_claim`'s, ``offers`` checked."""
    caps = _session_caps.get(session_id)
    if caps is None:
        row = WorkerSession.objects.filter(pk=session_id, worker_id=worker_id).values_list(
            "capabilities_sha256", "capabilities"
        )
        found = list(row)
        if not found:
            return None
        caps = found[0]
        _bounded(_session_caps, session_id, caps)
    return FunctionClaim(worker_id, session_id, generation, offers, caps)


class FunctionClaim:
    """One claim through ``ql_lease_claim``: its parameters (:meth:`params`, from what this process
    knows at the time of the call) and the reading of the function's answer (:meth:`answered`).
    The lease ids and token digests are drawn once: a call that claimed nothing wrote nothing."""

    def __init__(
        self,
        worker_id: uuid.UUID,
        session_id: uuid.UUID,
        generation: int,
        offers: list[OfferRequest],
        caps: tuple[str, str],
    ) -> None:
        self.worker_id, self.session_id, self.generation = worker_id, session_id, generation
        self.offers, self.caps = offers, caps
        self.digests = [token_digest(o.lease_token, worker_id=worker_id) for o in offers]
        self.lease_ids = [uuid7() for _ in offers]
        self.templates: dict[uuid.UUID, str] = {}

    def params(self) -> list[Any]:
        """``ql_lease_claim``'s arguments, in :data:`CLAIM_TYPES`' order."""
        settings = protocol()
        # Copies (one C-level step each under the GIL): another thread may learn or clear these
        # caches meanwhile, and the answer is built after the function has committed the claim.
        scores = dict(_class_scores.get(self.caps[0], {}))
        self.templates = _recent_templates()
        return [
            self.worker_id,
            self.session_id,
            self.generation,
            [o.offer_id for o in self.offers],
            self.digests,
            self.lease_ids,
            *_known(scores, self.templates),
            secrets.token_hex(2),
            timedelta(seconds=settings.dispatch_timeout_seconds),
            timedelta(seconds=settings.dispatch_hold_seconds),
            CLAIM_MAX_CLASSES,
            CLAIM_MAX_PAGES,
            CLAIM_FIRST_PAGE,
            QUEUE_PAGE,
            str(_RUN_MARKER),
            str(_ATTEMPT_MARKER),
            str(_NUMBER_MARKER),
        ]

    def answered(self, answer: Any) -> list[Offer] | None | object:
        """The offers the call (made with the last :meth:`params`) claimed; :data:`AGAIN` when
        it answered a placement class or revision this process has learnt now (call again);
        None when the Python path must answer (the call wrote nothing)."""
        if isinstance(answer, str):
            answer = json.loads(answer)
        status = answer["status"]
        if status == "claimed":
            claimed = [
                _offer(item, self.templates, self.worker_id, self.session_id, self.offers, self.digests)
                for item in answer["offers"]
            ]
            for item in answer["offers"]:
                _used(uuid.UUID(item["revision"]))
            return claimed
        if status == "unknown":
            _learn_classes(self.caps[0], self.caps[1], answer["classes"])
            return AGAIN
        if status == "revision":
            revision_id = uuid.UUID(answer["revision"])
            if _spec_template(revision_id) is None:
                return None
            _used(revision_id)  # learnt now or cached but not among the recent ones sent
            return AGAIN
        return None


def _offer(
    item: dict,
    templates: dict[uuid.UUID, str],
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    offers: list[OfferRequest],
    digests: list[str],
) -> Offer:
    """An Offer from one claimed item of ``ql_lease_claim`` (the n-th item used the n-th offer),
    with the spec from ``templates``, the ones the call was made with (the function only claims
    attempts of those revisions)."""
    lease_id = uuid.UUID(item["lease"])
    template = templates[uuid.UUID(item["revision"])]
    text = (
        template.replace(str(_RUN_MARKER), item["run"])
        .replace(str(_ATTEMPT_MARKER), item["attempt"])
        .replace(str(_NUMBER_MARKER), str(item["number"]))
    )
    position = item["position"]
    lease = lease_loaded(
        {
            "id": lease_id,
            "attempt_id": uuid.UUID(item["attempt"]),
            "run_id": uuid.UUID(item["run"]),
            "worker_id": worker_id,
            "session_id": session_id,
            "session_generation": item["sessionGeneration"],
            "lease_generation": item["leaseGeneration"],
            "offer_id": offers[position].offer_id,
            "token_digest": digests[position],
            "version": 0,
            "state": LeaseState.LEASED,
            "expires_at": datetime.fromisoformat(item["expires"]),
            "spec_sha256": item["spec"],
            "claimed_at": datetime.fromisoformat(item["claimed"]),
        }
    )
    return Offer(
        lease=lease, execution=json.loads(text), status="claimed", renew_interval_seconds=renew_interval()
    )
