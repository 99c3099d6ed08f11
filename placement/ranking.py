"""Claim-time ranking: the best-ranked live worker gets a fresh run (ADR-0012 §4, docs/placement.md §5).

In a pull model the claimer is whoever asks first, but candidates are ordered by (score desc,
free slots desc, worker id asc). So that the order means something when several eligible
workers poll at once, the fresh attempts of one placement are shared out in rank order: the
live workers that rank strictly above the claimer (and have free slots, so they poll too) are
entitled to as many of the head-of-queue attempts as they have free slots, and the claimer
defers those to them and takes the ones after. With one waiting run the best-ranked worker gets
it; with a burst of runs and a fleet of idle workers every worker claims in the same round
instead of queueing behind the best one. An attempt that has waited longer than
``QINGLONG["DISPATCH_HOLD_SECONDS"]`` goes to any eligible claimer, so a better worker that
stopped polling delays work by at most that long. Deferring never claims, locks or writes
anything: the better worker still has to win the claim itself (a candidate is not a claim).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, Protocol

from core.conf import protocol

from .matching import match
from .selectors import LiveWorker, Rank, live_workers, rank_key


class _Attempt(Protocol):
    ready_at: datetime


class _Worker(Protocol):
    pk: uuid.UUID


class ClaimRanking:
    """Per-claim helper answering "should this claimer leave this attempt to a better worker?".

    ``worker``: the claiming worker (anything with ``pk``); ``free_slots``: its free capacity
    counted under its worker lock; ``now``: the database clock of the claim transaction. The
    other live workers are read once, lazily (at most 1,024, one query), and which of them a
    placement admits is cached per placement digest for the rest of the claim. Reads only.
    """

    def __init__(self, worker: _Worker, free_slots: int, now: datetime) -> None:
        self.worker_id = str(worker.pk)
        self.free_slots = free_slots
        self.now = now
        self.hold = timedelta(seconds=protocol().dispatch_hold_seconds)
        self._others: list[LiveWorker] | None = None
        self._eligible: dict[str, list[tuple[Rank, int]]] = {}
        self._passed: dict[str, int] = {}

    def others(self) -> list[LiveWorker]:
        """The live workers other than the claimer (``placement.selectors.live_workers``; ADR-0012 §4)."""
        if self._others is None:
            self._others = [w for w in live_workers(now=self.now) if str(w.worker_id) != self.worker_id]
        return self._others

    def slots_ahead(self, placement_sha256: str, placement: dict[str, Any], score: int) -> int:
        """Free slots of other live workers that ``placement`` admits and that rank strictly above
        the claimer (which it admits with ``score``), at the claimer's current free slots."""
        if placement_sha256 not in self._eligible:
            self._eligible[placement_sha256] = [
                (rank_key(result.score, worker.free_slots, worker.worker_id), worker.free_slots)
                for worker in self.others()
                if worker.free_slots > 0 and (result := match(worker.capabilities, placement)).eligible
            ]
        mine = rank_key(score, self.free_slots, self.worker_id)
        return sum(free for rank, free in self._eligible[placement_sha256] if rank < mine)

    def defer(self, attempt: _Attempt, placement_sha256: str, placement: dict[str, Any], score: int) -> bool:
        """True if the claimer (which ``placement`` admits with ``score``) should skip ``attempt``.

        Call it for the claim's eligible attempts in queue order. ``attempt.ready_at``: when it
        became claimable (DB time). The n-th fresh attempt of a placement (counting from 0) is
        deferred while n is below :meth:`slots_ahead`; an attempt older than the dispatch hold is
        never deferred. ADR-0012 §4; docs/placement.md §5.
        """
        if attempt.ready_at <= self.now - self.hold:
            return False
        position = self._passed.get(placement_sha256, 0)
        self._passed[placement_sha256] = position + 1
        return position < self.slots_ahead(placement_sha256, placement, score)

    def claimed_one(self) -> None:
        """The claimer took an attempt: it has one free slot less, and ranks accordingly."""
        self.free_slots -= 1
