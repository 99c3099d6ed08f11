"""Reads for placement: live workers, ranked candidate pages, mismatch summaries (ADR-0012 §4).

A *live* worker is one whose current session is ``online`` with an unexpired session lease and
whose worker is ``active``: draining (worker- or operator-initiated), offline, fenced, revoked
and lease-expired workers are filtered out by the query itself, using the database clock, so
they vanish from candidates the moment their lease lapses — no sweep needed. Candidates are the
live workers whose capabilities satisfy the placement and that have a free slot (full workers
never appear); pages hold at most :data:`PAGE_SIZE` (64) and are ordered by (score desc, free
slots desc, worker id asc), with a keyset cursor on that same tuple.

Everything here reads; nothing writes or locks.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db.models import Count, Q

from core.errors import DomainError
from leases.models import LeaseState
from runs.models import Run, TaskRevision
from runs.selectors import placement_class_heads, waiting_placement_classes
from workers.models import SessionState, WorkerSession, WorkerState
from workers.selectors import fleet_counts

from .matching import CAPACITY, CATEGORIES, DRAINING, EXPIRED, SUMMARY_CATEGORIES, match, mismatches

#: Most candidates (or preview rows) on one page (ADR-0012 §4, docs/placement.md §5).
PAGE_SIZE = 64
#: Most live workers one placement decision looks at (16 pages of 64), by worker id.
MAX_LIVE_WORKERS = 16 * PAGE_SIZE

#: (−score, −free slots, worker id as text): ascending order is the candidate order.
Rank = tuple[int, int, str]
_CURSOR = re.compile(
    r"(0|[1-9][0-9]{0,5}):(0|[1-9][0-9]{0,3}):"
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\Z"
)


def rank_key(score: int, free_slots: int, worker_id: uuid.UUID | str) -> Rank:
    """Sort key of a candidate: score desc, free slots desc, worker id asc (ADR-0012 §4)."""
    return (-score, -free_slots, str(worker_id))


def encode_cursor(rank: Rank) -> str:
    """The keyset cursor text of ``rank``: ``"<score>:<free slots>:<worker id>"`` (ADR-0012 §4)."""
    return f"{-rank[0]}:{-rank[1]}:{rank[2]}"


def decode_cursor(text: str, field: str = "after") -> Rank:
    """Parse a cursor made by :func:`encode_cursor` (ADR-0012 §4).

    Raises ``validation_failed`` naming ``field`` for any other text.
    """
    found = _CURSOR.match(text) if isinstance(text, str) else None
    if found is None:
        raise DomainError(
            "validation_failed",
            "must be a cursor <score>:<free slots>:<worker id> from a previous page",
            field=field,
        )
    return (-int(found.group(1)), -int(found.group(2)), found.group(3))


@lru_cache(maxsize=2048)
def parse_capabilities(sha256: str, canonical: str) -> dict[str, Any]:
    """Parsed snapshot of a stored canonical text (cached by digest: snapshots are immutable; ADR-0012 §2)."""
    return json.loads(canonical)


@lru_cache(maxsize=1024)
def parse_placement(sha256: str, canonical: str) -> dict[str, Any]:
    """Parsed normalised placement for a stored canonical text (cached by digest) (ADR-0012 §4)."""
    return json.loads(canonical)


@dataclass(frozen=True)
class LiveWorker:
    """A live worker's current session as placement sees it (parsed canonical capabilities)."""

    worker_id: uuid.UUID
    worker_name: str
    session_id: uuid.UUID
    generation: int
    capabilities: dict[str, Any]
    max_concurrent_runs: int
    available_slots: int
    active_leases: int

    @property
    def free_slots(self) -> int:
        """Slots the control plane may still fill: the reported ceiling minus active leases."""
        return max(0, min(self.max_concurrent_runs, self.available_slots) - self.active_leases)


@dataclass(frozen=True)
class Candidate:
    """An eligible live worker with a free slot and its preferred-label score."""

    worker: LiveWorker
    score: int

    @property
    def rank(self) -> Rank:
        """Sort key: score desc, free slots desc, worker id asc."""
        return rank_key(self.score, self.worker.free_slots, self.worker.worker_id)


@dataclass(frozen=True)
class CandidatePage:
    """At most 64 candidates, best first; ``next_after`` is the cursor of the next page or None."""

    candidates: list[Candidate]
    next_after: Rank | None


def live_workers(*, now: datetime, limit: int = MAX_LIVE_WORKERS) -> list[LiveWorker]:
    """Live workers (see module doc) with their active lease counts, by worker id.

    ``now``: the database clock (``core.db.db_now``), compared with session lease expiry.
    ``limit``: at most this many (default 1,024). One query; reads only.
    ADR-0012 §3, §4.
    """
    sessions = (
        WorkerSession.objects.filter(
            state=SessionState.ONLINE, lease_expires_at__gt=now, worker__state=WorkerState.ACTIVE
        )
        .select_related("worker")
        .annotate(active_leases=Count("leases", filter=Q(leases__state=LeaseState.LEASED)))
        .order_by("worker_id")[:limit]
    )
    return [
        LiveWorker(
            worker_id=s.worker_id,
            worker_name=s.worker.name,
            session_id=s.pk,
            generation=s.generation,
            capabilities=parse_capabilities(s.capabilities_sha256, s.capabilities),
            max_concurrent_runs=s.max_concurrent_runs,
            available_slots=s.available_slots,
            active_leases=s.active_leases,
        )
        for s in sessions
    ]


def ranked_candidates(placement: dict[str, Any], workers: list[LiveWorker]) -> list[Candidate]:
    """Every eligible worker with a free slot, best first (score desc, free slots desc, id asc).

    ``placement``: a normalised placement document; ``workers``: from :func:`live_workers`.
    Pure: no database access.
    ADR-0012 §4.
    """
    eligible = []
    for worker in workers:
        if worker.free_slots <= 0:
            continue
        result = match(worker.capabilities, placement)
        if result.eligible:
            eligible.append(Candidate(worker=worker, score=result.score))
    return sorted(eligible, key=lambda c: c.rank)


def candidate_page(
    placement: dict[str, Any],
    workers: list[LiveWorker],
    *,
    after: Rank | None = None,
    size: int = PAGE_SIZE,
) -> CandidatePage:
    """One keyset page of :func:`ranked_candidates`: those ranked strictly after ``after``.

    ``size`` is capped at :data:`PAGE_SIZE` (64) and must be ≥ 1. ``next_after`` is the rank of
    the page's last candidate when more follow, else None. Pure: no database access.
    ADR-0012 §4.
    """
    size = max(1, min(size, PAGE_SIZE))
    ranked = ranked_candidates(placement, workers)
    if after is not None:
        ranked = [c for c in ranked if c.rank > after]
    page = ranked[:size]
    return CandidatePage(page, page[-1].rank if len(ranked) > size else None)


def run_candidates(*, run_id: uuid.UUID, now: datetime, after: Rank | None = None) -> CandidatePage:
    """The candidate page of a run's pinned placement against the live workers at ``now``.

    A candidate list is not a claim (ADR-0012 §3): the run goes to whichever candidate claims it.
    Raises ``run_not_found``.
    """
    pinned = (
        Run.objects.filter(pk=run_id).values_list("revision__placement_sha256", "revision__placement").first()
    )
    if pinned is None:
        raise DomainError("run_not_found", "no such run")
    placement = parse_placement(*pinned)
    return candidate_page(placement, live_workers(now=now), after=after)


def mismatch_summary(placement: dict[str, Any], workers: list[LiveWorker]) -> dict[str, int] | None:
    """Why live workers cannot take a run now: ``{category: number of live workers}``.

    Categories come from :data:`~placement.matching.SUMMARY_CATEGORIES` only: *every* failing
    ``required`` category of each worker counts (one worker may count under ``arch`` and
    ``gpu``), and ``capacity`` counts an eligible worker with no free slot; so a summary never
    holds labels, values or anything else a worker reported. Returns None when at least one
    live worker could take the run now, and ``{}`` when there is no live worker at all.
    Pure: no database access. ADR-0012 §4.
    """
    counts: Counter[str] = Counter()
    required = placement["required"]
    for worker in workers:
        result = match(worker.capabilities, placement)
        if result.category is not None:  # not eligible: count every failing category
            counts.update(mismatches(worker.capabilities, required))
        elif worker.free_slots <= 0:
            counts[CAPACITY] += 1
        else:
            return None
    return {category: counts[category] for category in SUMMARY_CATEGORIES if counts[category]}


def unavailable_workers(*, now: datetime) -> dict[str, int]:
    """Workers that are no candidates because they are ``draining`` or ``expired``, by category.

    Added to a pending run's summary so that it tells a draining or lapsed fleet from an absent
    one (``{}``: no worker live, draining or expired). ``now``: the database clock. One
    aggregate query over the workers (``workers.selectors.fleet_counts``). ADR-0012 §4.
    """
    counts = fleet_counts(now=now)
    return {category: counts[category] for category in (DRAINING, EXPIRED) if counts[category]}


def describe_summary(summary: dict[str, int]) -> str:
    """Text of a summary (ADR-0012 §4): ``{"arch": 3, "capacity": 2}`` → ``"arch: 3, capacity: 2"``.

    Categories appear in the fixed checking order whatever order the stored JSON came back in
    (PostgreSQL's jsonb reorders keys; SQLite keeps them). A summary with no live worker reads
    ``"no live worker"``, followed by the draining and expired counts when there are any
    (``"no live worker; draining: 1"``).
    """
    order = {category: index for index, category in enumerate(SUMMARY_CATEGORIES)}
    ordered = sorted(summary.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
    text = ", ".join(f"{category}: {count}" for category, count in ordered)
    if not any(category in summary for category in (*CATEGORIES, CAPACITY)):
        return "no live worker" + (f"; {text}" if text else "")
    return text


@dataclass(frozen=True)
class PreviewRow:
    """One live worker in a preview: would it take the run now, its score, else its category."""

    worker: LiveWorker
    eligible: bool
    score: int
    category: str | None
    #: Every failing category (``category`` is the first of them), or ``("capacity",)``.
    categories: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preview:
    """An operator's view of a placement against the live workers now (ADR-0012 §4).

    ``rows``: at most 64, those that would take it first (by rank), then the others by worker id
    with their first mismatch category; ``summary``: :func:`mismatch_summary` over *all* live
    workers; ``live_workers``/``eligible``: totals; ``truncated``: more rows than shown.
    """

    rows: list[PreviewRow]
    summary: dict[str, int] | None
    live_workers: int
    eligible: int
    truncated: bool


def _preview_order(row: PreviewRow) -> tuple[bool, int, int, str]:
    if row.eligible:
        return (False, *rank_key(row.score, row.worker.free_slots, row.worker.worker_id))
    return (True, 0, 0, str(row.worker.worker_id))


def placement_preview(
    placement: dict[str, Any], workers: list[LiveWorker], *, limit: int = PAGE_SIZE
) -> Preview:
    """For operators: which live workers would take a revision now, and why each other would not.

    ``placement``: a normalised placement document; ``workers``: :func:`live_workers`; ``limit``
    is capped at 64 rows. A row's ``category`` is the first mismatch, or ``capacity`` for an
    eligible worker without a free slot; ``eligible`` means it would take the run now.
    Pure: no database access.
    ADR-0012 §4.
    """
    rows = []
    for worker in workers:
        result = match(worker.capabilities, placement)
        category = result.category
        categories = mismatches(worker.capabilities, placement["required"]) if category else ()
        if result.eligible and worker.free_slots <= 0:
            category, categories = CAPACITY, (CAPACITY,)
        rows.append(
            PreviewRow(
                worker=worker,
                eligible=category is None,
                score=result.score,
                category=category,
                categories=categories,
            )
        )
    rows.sort(key=_preview_order)
    limit = max(1, min(limit, PAGE_SIZE))
    counts = Counter(category for row in rows for category in row.categories)
    eligible = sum(1 for row in rows if row.eligible)
    summary = None if eligible else {c: counts[c] for c in SUMMARY_CATEGORIES if counts[c]}
    return Preview(
        rows=rows[:limit],
        summary=summary,
        live_workers=len(rows),
        eligible=eligible,
        truncated=len(rows) > limit,
    )


def placement_admits(*, capabilities_sha256: str, capabilities: str, placement_sha256: str) -> bool:
    """Whether a session's capabilities (digest and canonical text) satisfy the placement class
    ``placement_sha256``; True for a class no revision names (a wake-up hint errs on waking).
    One indexed read of the placement text; the match itself is pure (``placement.matching``)."""
    text = (
        TaskRevision.objects.filter(placement_sha256=placement_sha256)
        .values_list("placement", flat=True)
        .first()
    )
    if text is None:
        return True
    snapshot = parse_capabilities(capabilities_sha256, capabilities)
    return match(snapshot, parse_placement(placement_sha256, text)).eligible


def claimable_placement_classes(*, now: datetime) -> list[str]:
    """Placement classes with at least one attempt claimable now (no live lease, not cancelled).

    The slow re-check of waiting claims (``api.waiting``): one loose index scan for the classes
    waiting, then one index probe per class for its head."""
    classes = waiting_placement_classes()
    return [sha for sha in classes if placement_class_heads(now=now, classes=[sha], size=1)]
