"""This process's worker session: registration, the fence it presents, and the session calls.

Every process start registers a new session (a fresh UUIDv7): the control plane answers with
its generation, version and timers, and fences any older session of the worker. The session
calls that change session state (heartbeat, drain, offline) carry ``expectedVersion``; the
version also moves under the worker (an operator drains or undrains it, or an earlier try's
answer was lost), so a ``session_version_conflict`` carrying the current version is adopted for
one more try (docs/sessions.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from protocol import messages as m
from protocol import wire
from protocol.ids import uuid7

from . import __version__
from .calls import Stop
from .client import ApiError

if TYPE_CHECKING:
    from .runtime import Agent

log = logging.getLogger("qinglong.agent")

#: Seconds registration keeps retrying while the control plane does not answer.
REGISTER_PATIENCE = 120.0


def seconds_between(later: str, earlier: str) -> float:
    """Seconds from one RFC 3339 wire time to another."""
    parse = datetime.fromisoformat
    return (parse(later.replace("Z", "+00:00")) - parse(earlier.replace("Z", "+00:00"))).total_seconds()


@dataclass
class Session:
    """The registered session: its fence, the version last seen, and the server's timers."""

    session_id: str
    generation: int
    version: int
    state: str
    heartbeat_interval: float
    lease_seconds: float
    last_ok: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def fence(self) -> m.SessionFence:
        return {"sessionId": self.session_id, "generation": self.generation}

    def transition(self) -> m.SessionTransition:
        """The body of drain and offline: the fence and the version this worker last saw."""
        return {**self.fence(), "expectedVersion": self.version}

    def heartbeat(self, available_slots: int) -> m.Heartbeat:
        return {**self.transition(), "availableSlots": available_slots}

    def apply(self, answer: m.SessionAnswer) -> None:
        """Adopt the version and state a session call answered."""
        with self.lock:
            self.version = answer["version"]
            self.state = answer["state"]
            self.last_ok = time.monotonic()

    def adopt_version(self, version: int) -> None:
        with self.lock:
            self.version = version

    def mark_draining(self) -> None:
        with self.lock:
            self.state = "draining"


def register(agent: Agent, capabilities: dict[str, Any]) -> Session:
    """Register a new session for this process (retried for ``REGISTER_PATIENCE`` seconds)."""
    body: m.Register = {
        "workerId": agent.credential.workerId,
        "sessionId": str(uuid7()),
        "capabilities": capabilities,
        "maxConcurrentRuns": agent.settings.max_concurrent,
        "availableSlots": agent.settings.max_concurrent,
        "softwareVersion": f"qinglong-worker/{__version__}",
        "protocolVersion": 1,
    }
    answer = cast(
        m.SessionAnswer,
        agent.call(wire.SESSION_REGISTER, body, patience=REGISTER_PATIENCE, stop=agent.shutdown_requested),
    )
    session = Session(
        session_id=answer["sessionId"],
        generation=answer["generation"],
        version=answer["version"],
        state=answer["state"],
        heartbeat_interval=answer["heartbeatIntervalSeconds"],
        lease_seconds=seconds_between(answer["leaseExpiresAt"], answer["serverTime"]),
    )
    log.info(
        "session %s registered: generation %s, version %s, %s%s",
        session.session_id,
        session.generation,
        session.version,
        session.state,
        " (replaced the previous session)" if answer["replacedSession"] else "",
    )
    return session


def session_call(
    agent: Agent,
    path: str,
    build: Callable[[Session], Mapping[str, object]] = Session.transition,
    *,
    done_if: frozenset[str] = frozenset(),
    patience: float | None = None,
    stop: threading.Event | None = None,
    before_try: Callable[[], None] | None = None,
    on_retry: Callable[[], None] | None = None,
) -> m.SessionAnswer | None:
    """A session call carrying ``expectedVersion`` (heartbeat, drain, offline); ``build`` makes
    its body from the session; ``before_try`` and ``on_retry`` as for ``agent.calls.call``.

    A ``session_version_conflict`` carrying ``currentVersion`` is adopted for one more try. An
    error code in ``done_if`` means the call's goal already holds (``session_offline`` for the
    offline call whose first answer was lost) and answers None. Raises like ``Agent.call``.
    """
    session = agent.session
    for attempt in range(2):
        try:
            # Built for each try: a heartbeat between two tries of a drain may have moved the version.
            answer = agent.call(
                path,
                lambda: build(session),
                patience=patience,
                stop=stop,
                before_try=before_try,
                on_retry=on_retry,
            )
            return cast(m.SessionAnswer, answer)
        except Stop as fenced:
            if isinstance(fenced.__cause__, ApiError) and fenced.__cause__.code in done_if:
                return None
            raise
        except ApiError as exc:
            if attempt or exc.code != "session_version_conflict" or "currentVersion" not in exc.details:
                raise
            session.adopt_version(exc.details["currentVersion"])
    raise AssertionError("unreachable")
