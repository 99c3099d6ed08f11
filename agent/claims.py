"""The claim loop, on the agent's main thread: ask for work while the session is online and a
slot is free, and start one attempt runner per offer.

Each claim offers up to ``wire.MAX_OFFERS_PER_CLAIM`` fresh (offer id, lease token) pairs, one
per free slot; the lease token never leaves this process except in lease calls (docs/leases.md).
The runners of what a claim answered send their starting ACKs before the loop's next request
goes out (it waits up to ``STARTING_FIRST_SECONDS`` for their answers): that ACK is on the path
from enqueue to a started job, the next claim or watch is not, and at the control plane the two
would compete for the same threads and database lock.

**Long polling (the default; docs/leases.md "Waiting claims").** One waiting claim is in flight
at a time (``claim/wait``), carrying an offer per free slot and the running attempts to watch
for cancellation: the server answers as soon as it claimed work for us, a watched attempt's
cancellation was requested, or the session changed — else after the wait it granted. The wait
keeps the session alive (the server extends its lease at the start), so while waits follow one
another the heartbeat timer is pushed back (``Heartbeat.postpone``) and an idle agent sends
about two requests a minute. With no slot free the request only watches; a runner finishing
cuts such a watch short (``Client.interrupt``: its lost answer costs nothing) so the freed slot
is offered at once. Against an older control plane (``claim/wait`` answers 404) the agent falls
back to short polling for good.

**Short polling** (``--no-long-poll``, or the fallback): an empty answer lengthens the wait
(×1.5 up to ``Settings.poll_max``); an offer, or a runner finishing, wakes the loop at once.

**The next claim (docs/leases.md, "The next claim").** A runner that completes its attempt while
the session is online asks, in the completion itself, for work for the slot it frees
(``next_offers``, ``take_next``): a busy agent then goes from one attempt to the next without a
claim of its own in between, and its waiting claim is not cut short for that slot. A control
plane that refuses the field (400 naming ``next``) is asked separately from then on.

``session_draining`` marks the session draining (no more claims until a heartbeat answers it
online again); ``capacity_exhausted`` and ``rate_limited`` wait quietly. Whatever a claim of any
kind answered once the agent began to stop (SIGTERM) or its session left ``online`` is released
at once (``lease/release``), never started: the attempt goes back to the queue for another worker
instead of lapsing after its dispatch timeout (started after all if the control plane does not
answer the release). A waiting claim that SIGTERM cut short lost its answer with the connection:
once the session is draining its offers are sent again one by one, which a draining session
answers only for an offer that had claimed something (a replay), and that is released too.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, cast

from protocol import messages as m
from protocol import wire
from protocol.errors import CATALOGUE
from protocol.ids import uuid7

from .attempts import AttemptRunner
from .calls import classify, transient
from .client import ApiError, TransportError

if TYPE_CHECKING:
    from .runtime import Agent

log = logging.getLogger("qinglong.agent")

#: How much longer the next idle wait is than the last.
POLL_GROWTH = 1.5
#: Seconds a waiting claim's answer may take beyond the wait the server granted.
WAIT_SLACK_SECONDS = 10.0
#: Longest the claim loop holds its next request back for the starting ACKs of what it just
#: claimed (they go first: each is on the path from enqueue to a started job).
STARTING_FIRST_SECONDS = 2.0
#: How long a stopping agent retries the release of an attempt claimed meanwhile before it starts
#: the attempt instead (``Claims._hand_back``).
HAND_BACK_PATIENCE_SECONDS = 5.0


class Claims:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.long_poll = agent.settings.long_poll
        #: The wait the server last granted, seconds (None until a waiting claim was answered).
        self.granted: float | None = None
        self._interrupted = threading.Event()
        self._in_flight = False
        self._watch_only = False
        #: Whether completions carry the next claim (off for good once the control plane refuses it).
        self.next_claims = True
        #: The offers of a waiting claim that SIGTERM cut short: what they claimed, if anything,
        #: is learnt and released once the session is draining (``recover_cut_short``).
        self.cut_short: list[m.OfferRequest] = []

    def _offers(self, free: int) -> list[m.OfferRequest]:
        return [
            {"offerId": str(uuid7()), "leaseToken": secrets.token_urlsafe(32)}
            for _ in range(min(max(0, free), wire.MAX_OFFERS_PER_CLAIM))
        ]

    def _start(self, answered: list[m.Offer], offers: list[m.OfferRequest]) -> int:
        """Start a runner per claimed offer; return once each sent its starting ACK and had the
        answer (at most ``STARTING_FIRST_SECONDS``), so that the loop's next request — sent at
        once after it — does not compete with the ACKs at the control plane.

        What a claim answered after the agent began to stop, or once its session left ``online``
        (a drain, learnt while the claim was in flight), is released instead (``_hand_back``):
        a stopping or draining agent starts nothing new, whichever call brought the offer —
        unless the control plane does not answer the release, and then it is started after all
        (the work is leased to this session: a drain lets it go on)."""
        if answered and (self.agent.shutdown_requested.is_set() or self.agent.session.state != "online"):
            return self._hand_back(answered, offers)
        return self._launch(answered, offers)

    def _launch(self, answered: list[m.Offer], offers: list[m.OfferRequest]) -> int:
        tokens = {offer["offerId"]: offer["leaseToken"] for offer in offers}
        runners = [AttemptRunner(self.agent, offer, tokens[offer["lease"]["offerId"]]) for offer in answered]
        for runner in runners:
            self.agent.start_runner(runner)
        deadline = time.monotonic() + STARTING_FIRST_SECONDS
        for runner in runners:
            left = deadline - time.monotonic()
            if left <= 0 or self.agent.shutdown_requested.is_set():
                break
            runner.acknowledged.wait(left)
        return len(runners)

    def once(self) -> int:
        """One short claim; returns how many attempts it started."""
        agent = self.agent
        session = agent.session
        free = agent.settings.max_concurrent - agent.running_count()
        if free <= 0 or session.state != "online":
            return 0
        offers = self._offers(free)
        body: m.Claim = {**session.fence(), "offers": offers}
        try:
            answer = cast(m.ClaimAnswer, agent.call(wire.CLAIM, body, stop=agent.shutdown_requested))
        except ApiError as exc:
            self._refused(exc)
            return 0
        except TransportError:
            return 0
        return self._start(answer["offers"], offers)

    def _refused(self, exc: ApiError) -> None:
        if exc.code == "session_draining":
            self.agent.session.mark_draining()
        elif transient(exc):  # a 429/503 whose retries a stop ended (shutdown, an interrupted wait)
            log.info("claim not answered: %s", exc)
        elif exc.code not in ("capacity_exhausted", "rate_limited"):
            log.error("claim refused: %s", exc)

    def next_offers(self) -> list[m.OfferRequest]:
        """The offer a completing runner sends for the slot it frees: one, or none when the
        session is not online, the agent is stopping or the control plane takes no next claim."""
        agent = self.agent
        if not self.next_claims or agent.session.state != "online" or agent.shutdown_requested.is_set():
            return []
        return self._offers(1)

    def take_next(self, answer: m.NextClaimAnswer | None, offers: list[m.OfferRequest]) -> int:
        """Start what a completion's next claim answered (``answer``, for ``offers``); returns how
        many attempts it started. A refusal is taken as a claim's (``session_draining`` marks
        the session draining; a fence or credential code stops the agent, as any call's does);
        what was claimed after the agent began to stop is released, not started (``_start``)."""
        if answer is None:
            return 0
        refused = answer.get("refused")
        if refused is not None:
            spec = CATALOGUE.get(refused["code"])
            exc = ApiError(spec.status if spec else 409, refused["code"], refused["message"])
            stop = classify(exc)  # a fenced session or a refused credential ends the agent, as in a call
            if stop is not None:
                self.agent.fail(stop)
            else:
                self._refused(exc)
            return 0
        started = self._start(answer["offers"], offers)
        if started:
            log.info("a completion's next claim started %d attempt(s)", started)
        return started

    def wait_once(self) -> int | None:
        """One waiting claim; returns how many attempts it started, or None when it did not wait
        (refused, unreachable, not online: the caller pauses before the next)."""
        agent = self.agent
        session = agent.session
        if session.state != "online" or agent.shutdown_requested.is_set():
            return None
        free = agent.settings.max_concurrent - agent.running_count()
        offers = self._offers(free)
        body: m.ClaimWait = {
            **session.fence(),
            "offers": offers,
            "watch": agent.watched_attempts(),
            "waitSeconds": agent.settings.wait_seconds,
        }
        if self.granted is not None:
            # While the wait is held the server keeps the session alive (docs/sessions.md).
            agent.heartbeat.postpone(self.granted + session.heartbeat_interval / 2)
        self._interrupted.clear()
        self._watch_only = not offers
        self._in_flight = True
        try:
            answer = cast(
                m.ClaimWaitAnswer,
                agent.call(
                    wire.CLAIM_WAIT,
                    body,
                    stop=self._interrupted,
                    timeout=agent.settings.wait_seconds + WAIT_SLACK_SECONDS,
                    interruptible=True,
                    # A try not answered (refused, timed out, 5xx): the server may be gone, and
                    # with it the keep-alive of this wait — heartbeat again at once, not only
                    # once the call gives up (it retries through an outage).
                    on_retry=agent.heartbeat.resume,
                ),
            )
        except ApiError as exc:
            agent.heartbeat.resume()
            if exc.status == 404 or (exc.code == "validation_failed" and exc.field == "waitSeconds"):
                log.info("the control plane has no waiting claims (%s): short polling from now on", exc.code)
                self.long_poll = False
                return 0
            self._refused(exc)
            return None
        except TransportError:
            agent.heartbeat.resume()
            if self._interrupted.is_set() and agent.shutdown_requested.is_set():
                self.cut_short = offers  # its answer may have claimed some: learnt after the drain
            return 0 if self._interrupted.is_set() and not agent.shutdown_requested.is_set() else None
        finally:
            self._in_flight = self._watch_only = False
        self.granted = answer["waitSeconds"]
        agent.heartbeat.apply(answer["session"])
        for attempt_id in answer["cancelRequested"]:
            runner = agent.runner(attempt_id)
            if runner is not None:
                runner.cancel()
        return self._start(answer["offers"], offers)

    def _hand_back(self, answered: list[m.Offer], offers: list[m.OfferRequest]) -> int:
        """Release what a claim answered after the agent began to stop (an attempt not started
        goes back to the queue at once, not after its dispatch timeout); returns how many
        attempts it started instead. A release the control plane does not answer within
        ``HAND_BACK_PATIENCE_SECONDS`` (unreachable, 503) would leave the lease to lapse — and the
        agent unable to go offline cleanly while it is held — so that attempt and every one after
        it are started, as before the stop: the drain waits for them, and one wait bounds the
        hand-back however many offers there are. A release refused outright (the lease ended
        meanwhile) is left at that."""
        tokens = {offer["offerId"]: offer["leaseToken"] for offer in offers}
        for index, offer in enumerate(answered):
            lease = offer["lease"]
            body = {
                **self.agent.session.fence(),
                "attemptId": lease["attemptId"],
                "leaseGeneration": lease["leaseGeneration"],
                "leaseToken": tokens[lease["offerId"]],
                "leaseVersion": lease["leaseVersion"],
            }
            try:
                self.agent.call(wire.LEASE_RELEASE, body, patience=HAND_BACK_PATIENCE_SECONDS)
            except (ApiError, TransportError) as exc:
                if transient(exc):
                    log.warning(
                        "attempt %s claimed while stopping could not be released (%s): starting it and "
                        "the %d after it instead",
                        lease["attemptId"],
                        exc,
                        len(answered) - index - 1,
                    )
                    return self._launch(answered[index:], offers)
                if not (isinstance(exc, ApiError) and exc.code == "lease_released"):  # not a resend
                    log.info("attempt %s claimed while stopping, not released: %s", lease["attemptId"], exc)
                    continue
            log.info("attempt %s claimed while stopping: released", lease["attemptId"])
        return 0

    def recover_cut_short(self) -> int:
        """Once the session is draining: learn what the waiting claim SIGTERM cut short had
        claimed (its answer was lost with the connection) and release it; returns how many
        attempts were started instead (``_hand_back``).

        Each of its offers is sent again as a claim of its own. A draining session's claim is
        answered only where every offer is a replay — the lease that offer took, ``idempotent``
        — and refused with ``session_draining`` otherwise, so an offer that claimed nothing
        claims nothing now (docs/leases.md, "The next claim"). Without this the lease lapsed
        after the dispatch timeout and the session could not go offline cleanly meanwhile."""
        offers, self.cut_short = self.cut_short, []
        started = 0
        for offer in offers:
            body: m.Claim = {**self.agent.session.fence(), "offers": [offer]}
            try:
                answer = cast(
                    m.ClaimAnswer, self.agent.call(wire.CLAIM, body, patience=HAND_BACK_PATIENCE_SECONDS)
                )
            except (ApiError, TransportError) as exc:
                if not (isinstance(exc, ApiError) and exc.code == "session_draining"):
                    log.info("offer %s of the cut-short waiting claim not learnt: %s", offer["offerId"], exc)
                continue  # session_draining: the offer claimed nothing
            started += self._hand_back(answer["offers"], [offer])
        return started

    def interrupt(self, *, watch_only: bool) -> None:
        """Cut the waiting claim in flight short: only a watch (``watch_only``), or any (stopping)."""
        if self._in_flight and (self._watch_only or not watch_only):
            self._interrupted.set()
            self.agent.client.interrupt()

    def loop(self) -> None:
        """Claim until shutdown is requested (raises Stop when the agent must end)."""
        agent = self.agent
        delay = agent.settings.poll_min
        while not agent.shutdown_requested.is_set():
            if self.long_poll:
                started = self.wait_once()
                if started is not None:
                    delay = agent.settings.poll_min
                    continue
            elif self.once():
                delay = agent.settings.poll_min
                continue
            agent.wake.wait(delay)
            agent.wake.clear()
            delay = min(agent.settings.poll_max, delay * POLL_GROWTH)
