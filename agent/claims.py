"""The claim loop, on the agent's main thread: ask for work while the session is online and a
slot is free, and start one attempt runner per offer.

Each claim offers up to ``wire.MAX_OFFERS_PER_CLAIM`` fresh (offer id, lease token) pairs; the
lease token never leaves this process except in lease calls (docs/leases.md). An empty answer
lengthens the wait (×1.5 up to ``Settings.poll_max``); an offer, or a runner finishing, wakes
the loop at once. ``session_draining`` marks the session draining (no more claims until a
heartbeat answers it online again); ``capacity_exhausted`` and ``rate_limited`` wait quietly.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, cast

from protocol import messages as m
from protocol import wire
from protocol.ids import uuid7

from .attempts import AttemptRunner
from .client import ApiError, TransportError

if TYPE_CHECKING:
    from .runtime import Agent

log = logging.getLogger("qinglong.agent")

#: How much longer the next idle wait is than the last.
POLL_GROWTH = 1.5


class Claims:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def once(self) -> int:
        """One claim; returns how many attempts it started."""
        agent = self.agent
        session = agent.session
        free = agent.settings.max_concurrent - agent.running_count()
        if free <= 0 or session.state != "online":
            return 0
        offers: list[m.OfferRequest] = [
            {"offerId": str(uuid7()), "leaseToken": secrets.token_urlsafe(32)}
            for _ in range(min(free, wire.MAX_OFFERS_PER_CLAIM))
        ]
        body: m.Claim = {**session.fence(), "offers": offers}
        try:
            answer = cast(m.ClaimAnswer, agent.call(wire.CLAIM, body, stop=agent.shutdown_requested))
        except ApiError as exc:
            if exc.code == "session_draining":
                session.mark_draining()
            elif exc.code not in ("capacity_exhausted", "rate_limited"):
                log.error("claim refused: %s", exc)
            return 0
        except TransportError:
            return 0
        tokens = {offer["offerId"]: offer["leaseToken"] for offer in offers}
        for offer in answer["offers"]:
            agent.start_runner(AttemptRunner(agent, offer, tokens[offer["lease"]["offerId"]]))
        return len(answer["offers"])

    def loop(self) -> None:
        """Claim until shutdown is requested (raises Stop when the agent must end)."""
        agent = self.agent
        delay = agent.settings.poll_min
        while not agent.shutdown_requested.is_set():
            if self.once():
                delay = agent.settings.poll_min
                continue
            agent.wake.wait(delay)
            agent.wake.clear()
            delay = min(agent.settings.poll_max, delay * POLL_GROWTH)
