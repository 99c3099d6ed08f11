"""A completion that carries the next claim: the attempt's result, then work for the slot it frees,
in one request (docs/leases.md, "The next claim"): on PostgreSQL one transaction when the server
functions answer both, otherwise two."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from django.db import connection

from core.db import call_function, lock_timeout_refusal, typed_call
from core.dependencies import dependency_error
from core.errors import DomainError
from core.wakeups import LISTENING_SQL
from leases.offers import Offer

from .claims import (
    AGAIN,
    CLAIM_TYPES,
    OfferRequest,
    check_offers,
    function_claim,
    lease_claim,
    lease_claim_in_python,
)
from .completion import (
    COMPLETE_TYPES,
    Completion,
    CompletionResult,
    check_completion,
    complete_params,
    completed_in_database,
    known_attempt,
    lease_complete,
    remember_attempt,
)

#: The claim's arguments after the fence it shares with the completion (worker, session, generation).
_CLAIM_OWN_TYPES = CLAIM_TYPES.split(", ", 3)[3]
#: The completion and its claim (migration leases 0017), and whether any process holds waiting claims.
_COMPLETE_AND_CLAIM_SQL = (
    typed_call("ql_lease_complete_and_claim", f"{COMPLETE_TYPES}, {_CLAIM_OWN_TYPES}") + f", {LISTENING_SQL}"
)


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

    PostgreSQL: when this process knows the attempt's revision (its running ACK told it) and the
    session, both run in one statement and one transaction (``ql_lease_complete_and_claim``,
    migration leases 0017): the claim after the completion's writes, the worker row locked from
    one to the other, one commit. Whatever that call leaves to Python takes the road above.

    Raises: ``validation_failed`` naming ``next.offers…`` before anything is written, and
    whatever :func:`lease_complete` raises (then nothing is claimed).
    """
    check_offers(offers, at="next.offers")
    if connection.vendor == "postgresql":
        check_completion(completion)
        both = _in_one_call(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            attempt_id=attempt_id,
            lease_generation=lease_generation,
            lease_token=lease_token,
            completion=completion,
            offers=offers,
        )
        if both is not None:
            return both
    result = lease_complete(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
        completion=completion,
    )
    return result, _claim(worker_id=worker_id, session_id=session_id, generation=generation, offers=offers)


def _claim(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    offers: list[OfferRequest],
    in_python: bool = False,
) -> NextClaim:
    """The claim after a committed completion: its refusal answered, not raised. ``in_python``:
    the server function has just handed this claim to Python (its Python path alone)."""
    claim = lease_claim_in_python if in_python else lease_claim
    try:
        claimed = claim(worker_id=worker_id, session_id=session_id, generation=generation, offers=offers)
    except Exception as exc:
        return _refused(exc)
    return NextClaim(claimed)


def _refused(exc: Exception) -> NextClaim:
    """The claim's refusal after a committed completion: a ``DomainError`` as it is, a database
    failure as its 503 code (``core.dependencies``); anything else (a bug) is raised. The
    completion is committed: a database that fails the claim must not make the whole call look
    refused (the worker would resend it until its hard deadline)."""
    if isinstance(exc, DomainError):
        return NextClaim([], exc)
    unavailable = dependency_error(exc)
    if unavailable is None:
        raise exc
    return NextClaim([], unavailable)


def _in_one_call(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    completion: Completion,
    offers: list[OfferRequest],
) -> tuple[CompletionResult, NextClaim] | None:
    """Both through ``ql_lease_complete_and_claim`` (PostgreSQL): one statement, one transaction.

    None when the two-call road must answer, with nothing written: this process does not know
    the attempt's revision (the function's ``learn`` teaches it) or the session, the completion
    was not the function's to make (a refusal or replay: ``lease_complete`` answers it), or the
    call failed (a ``QL409`` race, an outage: both parts rolled back, and the two-call road
    retries and answers them as it always does; a commit whose answer was lost is replayed there
    exactly). A lock wait that ran out is raised as ``lock_timeout`` (503), as the completion's
    own call raises it: not waited for a second time. Once the completion is committed, a claim
    the function left to Python (a refusal, a class or revision to learn) is made as the two-call
    road makes it, and a failure of the database meanwhile is the claim's refusal, not the call's."""
    known = known_attempt(attempt_id)
    if known is None:
        return None
    claim = function_claim(worker_id=worker_id, session_id=session_id, generation=generation, offers=offers)
    if claim is None:
        return None
    params = complete_params(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        attempt_id=attempt_id,
        lease_generation=lease_generation,
        lease_token=lease_token,
        completion=completion,
        known=known,
    )
    params += claim.params()[3:]  # its worker, session and generation are the completion's
    try:
        answer, listening = call_function(_COMPLETE_AND_CLAIM_SQL, params)
    except Exception as exc:
        if connection.in_atomic_block:  # a caller's transaction (tests) is spoilt: nothing to retry in
            raise
        refusal = lock_timeout_refusal(exc)
        if refusal is not None:  # answered as the completion's own call answers it: not waited twice
            raise refusal from exc
        return None
    if isinstance(answer, str):
        answer = json.loads(answer)
    done = answer["complete"]
    if done["status"] != "completed":
        if done["status"] == "learn":
            remember_attempt(attempt_id, uuid.UUID(done["revision"]), done["number"])
        return None
    completed_in_database(worker_id, attempt_id, listening)
    result = CompletionResult(attempt_id, lease_generation, completion.sequence, completion.outcome)
    try:
        claimed = claim.answered(answer["claim"])  # may read what it learns: the database may fail
    except Exception as exc:
        return result, _refused(exc)
    if claimed is None or claimed is AGAIN:
        return result, _claim(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            offers=offers,
            in_python=claimed is None,
        )
    return result, NextClaim(claimed)  # type: ignore[arg-type]
