"""The waiting claim, ``POST /api/v1/worker/claim/wait``: a claim that may wait for work (issue 18).

A plain async Django view (DRF has no async views). Everything a worker request goes through
happens exactly as on the DRF worker views, in a pool thread, by running :class:`ClaimWaitCheck`
(a ``WorkerAPIView``): signature, clock window, credential, digest and nonce (401; the nonce is
used once, for the whole wait), the per-worker rate limit (429), strict JSON (400), principal
binding (403), the body fields (400) — and its refusals are the API's JSON errors. Then the wait,
on the event loop (docs/leases.md, "Waiting claims"):

1. read the session fenced and keep it alive (``session_keep_alive``; while the claim waits the
   hub's ``sessions_keep_alive``: a held wait is the worker's heartbeat), refuse a draining one,
   and claim if any attempt is claimable (``lease_claim``, the one synchronous claim service:
   fence and capacity are checked at the moment of claiming, every time);
2. answer at once if offers were claimed or a watched attempt's cancellation was requested;
3. otherwise sleep on the process's hub (``api.waiting``) until a wake-up, then claim again; a
   worker wake-up after which the session reads changed (version, state, a forced key
   rotation) answers at once (``ended: session``) with that fresh read;
4. answer when the bound passes (``ended: timeout``), on shutdown, when a newer wait of the same
   session supersedes this one (``superseded``: at most ``MAX_WAITS_PER_SESSION``), or with the refusal of any
   claim — a session replaced, expired or offline, a revoked worker, a draining session
   (``session_draining``, a watch-only wait too) end the wait fenced, having claimed nothing.

No thread and no database connection is held while waiting; ``capacity_exhausted`` does not
end a wait (the lease that frees capacity wakes it).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from actions.leases.claims import OfferRequest, check_offers, lease_claim
from actions.sessions.heartbeat import session_keep_alive
from api.base import WorkerAPIView, validated
from api.exceptions import bad_request, exception_handler
from api.middleware import BodyLimitMiddleware
from api.waiting import HUB, Waiter, run_sync
from api.workers.serializers import session_out
from core.conf import RECEIVED_AT_SCOPE_KEY, claim_wait_bound, protocol
from core.errors import DomainError
from core.metrics import WAITING_CLAIMS
from leases.offers import Offer
from leases.selectors import cancel_requested_attempt_ids
from placement.selectors import claimable_placement_classes
from protocol import messages
from workers.models import SessionState
from workers.principals import WorkerPrincipal
from workers.sessions import SessionView

from . import serializers as s

#: Attribute of the Django request where :class:`ClaimWaitCheck` leaves what it checked.
_CHECKED = "qinglong_claim_wait"


class ClaimWaitCheck(WorkerAPIView):
    """The waiting claim's checks, as on every worker endpoint (see the module docstring); it is
    also what the route names as its view class (``claim_wait.cls``: the body limit, OpenAPI)."""

    max_json_depth = 3

    @extend_schema(
        request=s.ClaimWaitSerializer,
        responses={200: s.ClaimWaitOutSerializer},
        description=(
            "Claim now or wait up to waitSeconds (bounded by the server, which answers the bound it "
            "chose) for work, a cancellation of a watched attempt or a change of the session; see "
            "docs/leases.md, Waiting claims. Served by an async view."
        ),
    )
    def post(self, request):
        data = validated(s.ClaimWaitSerializer, request)
        if data["offers"]:
            # Refused now, as a plain claim refuses them, not only once a round finds work to claim.
            check_offers([OfferRequest(o["offerId"], o["leaseToken"]) for o in data["offers"]])
        setattr(request._request, _CHECKED, (self.principal, data))
        return Response(status=204)


_check_view = ClaimWaitCheck.as_view()
_body_limit = BodyLimitMiddleware(lambda request: HttpResponse())


def _check(request: HttpRequest) -> HttpResponse | tuple[WorkerPrincipal, dict]:
    """Run the checks in this (pool) thread: the checked principal and body, or the refusal."""
    refused = _body_limit.process_view(request, _check_view, (), {})
    if refused is not None:
        return refused
    response = _check_view(request)
    checked = getattr(request, _CHECKED, None)
    if response.status_code != 204 or checked is None:
        response.render()  # a DRF Response: the API's JSON error body
        return response
    return checked


#: The methods the route takes, as its ``Allow`` header says (OPTIONS answers like every DRF view).
ALLOW = "POST, OPTIONS"


def _options(request: HttpRequest) -> HttpResponse:
    """``OPTIONS claim/wait``: answered by the check view, as on every worker endpoint."""
    response = _check_view(request)
    response.render()
    response["Allow"] = ALLOW
    return response


def _session_changed(before: SessionView, after: SessionView) -> bool:
    """Whether a round saw the session change since the wait began (a heartbeat would tell it)."""
    return (before.session.version, before.session.state, before.rotation_required) != (
        after.session.version,
        after.session.state,
        after.rotation_required,
    )


@dataclass
class _Round:
    """What one claim round found."""

    offers: list[Offer]
    cancels: list[str]
    session: SessionView | None = None


def _round(fence: dict, offers: list[OfferRequest], watch: set[str], *, probe: bool = True) -> _Round:
    """One round in a pool thread (one hop): the session, then the claim if there is work.

    The session is read fenced and kept alive (``session_keep_alive``: a replaced, expired,
    offline session or a revoked worker is refused here), a draining one is refused like the claim
    service refuses it (``session_draining``), and ``lease_claim`` — which fences again under the
    worker lock and checks capacity as it claims — runs only when some attempt is claimable at
    all (``claimable_placement_classes``, an index probe), so an idle wait writes nothing. With
    ``probe=False`` (the round after a ``work`` wake-up, which says work of a class this worker
    can run was committed) the probe is skipped and the claim runs at once.
    Raises DomainError for any refusal but ``capacity_exhausted`` (a full session waits)."""
    view = session_keep_alive(**fence)
    claimed: list[Offer] = []
    # A draining session ends every wait, a watch-only one too: the agent stops waiting and
    # heartbeats while it drains (docs/leases.md, "Waiting claims").
    if view.session.state == SessionState.DRAINING:
        raise DomainError(
            "session_draining", "the session is draining and takes no new runs", field="sessionId"
        )
    if offers:
        if not probe or claimable_placement_classes(now=view.server_time):
            try:
                claimed = lease_claim(**fence, offers=offers)
            except DomainError as exc:
                if exc.code != "capacity_exhausted":
                    raise
    if claimed:
        requested = {str(attempt) for attempt in cancel_requested_attempt_ids(fence["session_id"])}
    else:
        requested = {str(attempt) for attempt in view.cancel_requested}
    return _Round(claimed, sorted(requested & watch), view)


def _json(data: Any, status: int) -> HttpResponse:
    """``data`` rendered as every other endpoint renders it (DRF's ``JSONRenderer``: compact,
    UTF-8), so a refusal met while waiting has the same bytes as one met in the checks."""
    return HttpResponse(JSONRenderer().render(data), status=status, content_type="application/json")


def _answer(result: _Round, session: SessionView, bound: float, ended: str) -> HttpResponse:
    data: messages.ClaimWaitAnswer = {  # as ClaimWaitOutSerializer documents it (api.leases.serializers)
        "offers": [s.offer_out(offer) for offer in result.offers],
        "cancelRequested": result.cancels,
        "waitSeconds": float(bound),
        "ended": ended,
        "session": session_out(session),
    }
    response = _json(data, 200)
    response.data = data  # type: ignore[attr-defined]  # read by the access log's outcome label
    return response


def _refusal(exc: DomainError) -> HttpResponse:
    """A refusal met while waiting, as the API's JSON error (``api.exceptions``)."""
    handled = exception_handler(exc, {})
    assert handled is not None  # every DomainError maps to an answer
    response = _json(handled.data, handled.status_code)
    if "Retry-After" in handled:
        response["Retry-After"] = handled["Retry-After"]
    response.data = handled.data  # type: ignore[attr-defined]  # read by the access log's outcome label
    return response


@csrf_exempt
async def claim_wait(request: HttpRequest) -> HttpResponse:
    """``POST claim/wait``: claim now or wait (bounded) for work, a watched cancellation or a
    fence change; see the module docstring and docs/leases.md "Waiting claims"."""
    try:
        request.get_host()  # ALLOWED_HOSTS, as CommonMiddleware checks it on every other road
    except DisallowedHost as exc:
        refused = bad_request(request, exc)
        refused.data = json.loads(refused.content)  # type: ignore[attr-defined]  # the outcome label
        return refused
    if request.method == "OPTIONS":
        return await run_sync(_options, request)
    if request.method != "POST":
        refused = _refusal(DomainError("method_not_allowed", f"{request.method} is not allowed here"))
        refused["Allow"] = ALLOW
        return refused
    loop = asyncio.get_running_loop()
    # The bound runs from the request's arrival (stamped by qinglong.serving.RequestGuard): the
    # time it queued for a pool thread and its checks counts against it, so that the answer comes
    # within the bound of the worker sending it, however busy the pool is.
    received = getattr(request, "scope", {}).get(RECEIVED_AT_SCOPE_KEY, loop.time())
    checked = await run_sync(_check, request)
    if isinstance(checked, HttpResponse):
        return checked
    principal, data = checked
    fence = {
        "worker_id": principal.worker_id,
        "session_id": data["sessionId"],
        "generation": data["generation"],
    }
    offers = [OfferRequest(o["offerId"], o["leaseToken"]) for o in data["offers"]]
    watch = {str(attempt) for attempt in data["watch"]}
    # Jittered like heartbeats, so that a fleet's waits that began together end spread out.
    bound = round(
        claim_wait_bound(data["waitSeconds"]) * (1 - random.uniform(0, protocol().heartbeat_jitter_ratio)), 3
    )
    deadline = received + bound
    waiter = Waiter(
        str(principal.worker_id),
        wants_work=bool(offers),
        session=(data["sessionId"], data["generation"]),
        free=len(offers),
    )
    HUB.add(waiter)  # before the first round: a wake-up committed during it is not lost
    WAITING_CLAIMS.inc()
    try:
        seen = HUB.work_seq
        try:
            result = await run_sync(_round, fence, offers, watch)
        except DomainError as exc:
            return _refusal(exc)
        assert result.session is not None
        first = result.session
        if offers:
            session_row = result.session.session
            HUB.want_work(waiter, session_row.capabilities_sha256, session_row.capabilities)
            if HUB.work_seq != seen:  # work came while the first round ran, before it had a group
                waiter.wake("work")
        ended = "offers" if result.offers else "cancel" if result.cancels else ""
        while not ended:
            reason = await waiter.sleep(deadline - loop.time())
            if reason in ("timeout", "shutdown", "superseded"):
                ended = reason
                break
            try:
                result = await run_sync(_round, fence, offers, watch, probe=reason != "work")
            except DomainError as exc:
                return _refusal(exc)
            if result.offers:
                ended = "offers"
                if len(result.offers) == len(offers):
                    HUB.pass_on(waiter)  # it took all it asked for: more may be waiting
            elif result.cancels:
                ended = "cancel"
            elif (
                reason == "worker" and result.session is not None and _session_changed(first, result.session)
            ):
                ended = "session"  # e.g. a forced key rotation: the worker hears it now, not at the bound
        # The last round's view of the session: on a timeout or shutdown too (a change to the
        # session would have woken the wait, and that round read it fresh), so that a fleet's
        # waits end without a read each.
        session = result.session
        assert session is not None  # every round reads it
        if ended not in ("offers", "cancel"):
            result = _Round([], [], session)
        return _answer(result, session, bound, ended)
    finally:
        HUB.remove(waiter)
        WAITING_CLAIMS.dec()


# The route's view class, for what reads it: BodyLimitMiddleware (the main handler), the route
# checks and drf-spectacular's schema (docs/openapi.yaml).
claim_wait.cls = ClaimWaitCheck  # type: ignore[attr-defined]
claim_wait.initkwargs = {}  # type: ignore[attr-defined]
