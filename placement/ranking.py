"""Claim-time ranking: the best-ranked live worker gets a fresh run (ADR-0012 §4, SIBLINGS §4, §5).

In a pull model the claimer is whoever asks first, but candidates are ordered by (score desc,
free slots desc, worker id asc). So that the order means something when several eligible
workers poll at once, a claimer *defers* a fresh attempt to a strictly better-ranked live
worker that has a free slot (and therefore polls too). An attempt that has waited longer than
``QINGLONG["DISPATCH_HOLD_SECONDS"]`` goes to any eligible claimer, so a better worker that
stopped polling delays work by at most that long. Deferring never claims, locks or writes
anything: the better worker still has to win the claim itself (a candidate is not a claim).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, Protocol

from qinglong.conf import protocol

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
    other live workers are read once, lazily (at most 1,024, one query), and the best rank per
    placement digest is cached for the rest of the claim. Reads only.
    """

    def __init__(self, worker: _Worker, free_slots: int, now: datetime) -> None:
        self.worker_id = str(worker.pk)
        self.free_slots = free_slots
        self.now = now
        self.hold = timedelta(seconds=protocol().dispatch_hold_seconds)
        self._others: list[LiveWorker] | None = None
        self._best: dict[str, Rank | None] = {}

    def others(self) -> list[LiveWorker]:
        """The live workers other than the claimer (``placement.selectors.live_workers``; ADR-0012 §4)."""
        if self._others is None:
            self._others = [w for w in live_workers(now=self.now) if str(w.worker_id) != self.worker_id]
        return self._others

    def best_other(self, placement_sha256: str, placement: dict[str, Any]) -> Rank | None:
        """Rank of the best other live worker with a free slot that ``placement`` admits, or None.

        Cached per placement digest for the claim (ADR-0012 §4).
        """
        if placement_sha256 not in self._best:
            ranks = [
                rank_key(result.score, worker.free_slots, worker.worker_id)
                for worker in self.others()
                if worker.free_slots > 0 and (result := match(worker.capabilities, placement)).eligible
            ]
            self._best[placement_sha256] = min(ranks) if ranks else None
        return self._best[placement_sha256]

    def defer(self, attempt: _Attempt, placement_sha256: str, placement: dict[str, Any], score: int) -> bool:
        """True if the claimer (which ``placement`` admits with ``score``) should skip ``attempt``.

        ``attempt.ready_at``: when it became claimable (DB time). Deferral holds only while the
        attempt is younger than the dispatch hold and a strictly better-ranked other live worker
        with a free slot exists.
        ADR-0012 §4; SIBLINGS §5.
        """
        if attempt.ready_at <= self.now - self.hold:
            return False
        best = self.best_other(placement_sha256, placement)
        return best is not None and best < rank_key(score, self.free_slots, self.worker_id)
