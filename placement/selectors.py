"""Reads for placement: live workers, ranked candidate pages, mismatch summaries (ADR-0012 §4).

A *live* worker is one whose current session is ``online`` with an unexpired session lease and
whose worker is ``active``: draining, offline, fenced, revoked and lease-expired workers are
filtered out by the query itself, using the database clock, so they vanish from candidates the
moment their lease lapses — no sweep needed. Candidates are the live workers whose capabilities
satisfy the placement and that have a free slot; pages hold at most 64 and are ordered by
(score desc, free slots desc, worker id asc).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db.models import Count, Q

from workers.models import SessionState, WorkerSession, WorkerState

from .matching import CAPACITY, match

PAGE_SIZE = 64
#: Most live workers one placement decision looks at (16 pages of 64).
MAX_LIVE_WORKERS = 16 * PAGE_SIZE


@lru_cache(maxsize=2048)
def parse_capabilities(sha256: str, canonical: str) -> dict[str, Any]:
    """Parsed snapshot for a stored canonical text (cached by digest; snapshots are immutable)."""
    return json.loads(canonical)


@lru_cache(maxsize=1024)
def parse_placement(sha256: str, canonical: str) -> dict[str, Any]:
    """Parsed normalised placement for a stored canonical text (cached by digest)."""
    return json.loads(canonical)


@dataclass(frozen=True)
class LiveWorker:
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
    worker: LiveWorker
    score: int

    @property
    def rank(self) -> tuple[int, int, str]:
        """Sort key: score desc, free slots desc, worker id asc."""
        return (-self.score, -self.worker.free_slots, str(self.worker.worker_id))


def live_workers(*, now: datetime, limit: int = MAX_LIVE_WORKERS) -> list[LiveWorker]:
    """Live workers (see module doc) with their active lease counts, by worker id, at most ``limit``."""
    sessions = (
        WorkerSession.objects.filter(
            state=SessionState.ONLINE, lease_expires_at__gt=now, worker__state=WorkerState.ACTIVE
        )
        .select_related("worker")
        .annotate(active_leases=Count("leases", filter=Q(leases__state="leased")))
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
    """Every eligible worker with a free slot, best first (score, free slots, worker id)."""
    eligible = []
    for worker in workers:
        if worker.free_slots <= 0:
            continue
        result = match(worker.capabilities, placement)
        if result.eligible:
            eligible.append(Candidate(worker=worker, score=result.score))
    return sorted(eligible, key=lambda c: c.rank)


def candidate_page(
    placement: dict[str, Any], workers: list[LiveWorker], *, after: tuple[int, int, str] | None = None,
    size: int = PAGE_SIZE,
) -> list[Candidate]:
    """One keyset page (at most 64) of :func:`ranked_candidates`, starting after rank ``after``."""
    size = min(size, PAGE_SIZE)
    ranked = ranked_candidates(placement, workers)
    if after is not None:
        ranked = [c for c in ranked if c.rank > after]
    return ranked[:size]


def mismatch_summary(placement: dict[str, Any], workers: list[LiveWorker]) -> dict[str, int]:
    """Why live workers cannot take a run now: {category: number of workers} (low cardinality).

    Eligible workers without a free slot count as ``capacity``. An empty dict means at least one
    eligible worker has a free slot.
    """
    counts: Counter[str] = Counter()
    for worker in workers:
        result = match(worker.capabilities, placement)
        if not result.eligible:
            counts[result.category or "unknown"] += 1
        elif worker.free_slots <= 0:
            counts[CAPACITY] += 1
        else:
            return {}
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class PreviewRow:
    worker: LiveWorker
    eligible: bool
    score: int
    category: str | None


def placement_preview(placement: dict[str, Any], workers: list[LiveWorker]) -> list[PreviewRow]:
    """For operators: every live worker, whether it would take the revision now, and why not.

    Rows are ordered like candidates (eligible with free slots first, by rank), then the rest by
    worker id. ``category`` is the first mismatch, or ``capacity`` for an eligible full worker.
    """
    rows = []
    for worker in workers:
        result = match(worker.capabilities, placement)
        category = result.category
        if result.eligible and worker.free_slots <= 0:
            category = CAPACITY
        rows.append(PreviewRow(worker=worker, eligible=category is None, score=result.score, category=category))
    return sorted(
        rows,
        key=lambda r: (not r.eligible, -r.score, -r.worker.free_slots, str(r.worker.worker_id)),
    )
