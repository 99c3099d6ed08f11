"""A completion that carries the next claim: the attempt's result, then work for the slot it frees,
in one request and two transactions (docs/leases.md, "The next claim")."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from core.dependencies import dependency_error
from core.errors import DomainError
from leases.offers import Offer

from .claims import OfferRequest, check_offers, lease_claim
from .completion import Completion, CompletionResult, lease_complete


@dataclass(frozen=True)
class NextClaim:
    """What a completion's next claim answered: the offers claimed (``[]`` when no work was
    runnable), or the refusal a claim would have raised (``refused``; ``offers`` then empty)."""

    offers: list[Offer]
    refused: DomainError | None = None


def lease_complete_and_claim(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    completion: Completion,
    offers: list[OfferRequest],
) -> tuple[CompletionResult, NextClaim]:
    """Complete an attempt, then claim work for the worker session with ``offers``.

    docs/leases.md, "The next claim". Arguments: those of :func:`lease_complete`, and a claim's
    offers (1–8 worker-generated offer ids and lease tokens, as :func:`lease_claim` takes them).

    The offers are checked first, so that a malformed one refuses the whole call with nothing
    written. Then :func:`lease_complete` runs in its transaction and, only once it answered (a
    commit or an exact replay), :func:`lease_claim` in its own: the claim runs under the same
    session fence after the completion, so it sees the capacity the attempt freed. The
    completion's answer stands whatever the claim does: a claim refusal (``session_draining``,
    ``capacity_exhausted``, a fence code, ``lease_offer_conflict``, ``lock_timeout``, or the 503 of
    a database that failed it: ``core.dependencies``) is answered in ``NextClaim.refused``, not
    raised. A resent call replays both: the completion exactly, the
    offers as a claim replays them (the same leases, ``idempotent``).

    Raises: ``validation_failed`` naming ``next.offers…`` before anything is written, and
    whatever :func:`lease_complete` raises (then nothing is claimed).
    """
    check_offers(offers, at="next.offers")
    result = lease_complete(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
        completion=completion,
    )
    try:
        claimed = lease_claim(
            worker_id=worker_id, session_id=session_id, generation=generation, offers=offers
        )
    except DomainError as refusal:
        return result, NextClaim([], refusal)
    except Exception as exc:
        # The completion is committed: a database that fails the claim must not make it look
        # refused (the worker would resend it until its hard deadline). Its 503 is the refusal.
        unavailable = dependency_error(exc)
        if unavailable is None:
            raise
        return result, NextClaim([], unavailable)
    return result, NextClaim(claimed)
