"""The heartbeat loop: one timer thread that keeps the session lease alive and hears the server.

One heartbeat at a time (a loop, never overlapping itself), on a daemon thread so it never holds
the process up. Each answer carries the session's version and state (adopted), the attempts
whose cancellation was requested (their runners are told) and whether the operator requires a
key rotation (carried out here: ``agent.rotation``). The slots offered drop to 0 once shutdown
is requested; the loop keeps running while the agent drains and stops before it goes offline.
A fenced session or a refused credential stops the agent (``Agent.fail``).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from protocol import wire

from .calls import Stop
from .client import ApiError, TransportError
from .rotation import rotate_key
from .session import seconds_between, session_call

if TYPE_CHECKING:
    from .runtime import Agent

log = logging.getLogger("qinglong.agent")

#: Shortest wait between two heartbeats, seconds, whatever the server asks.
MIN_DELAY = 0.5


class Heartbeat:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        delay = self.agent.session.heartbeat_interval
        while not self.stopped.wait(delay):
            try:
                delay = self.step()
            except Stop as stop:
                self.agent.fail(stop)
                return
            except TransportError:
                return  # only when stopping: calls retry forever otherwise

    def step(self) -> float:
        """One heartbeat and what its answer asks for; returns the delay until the next one."""
        agent = self.agent
        slots = 0 if agent.shutdown_requested.is_set() else agent.settings.max_concurrent
        try:
            answer = session_call(
                agent, wire.SESSION_HEARTBEAT, lambda session: session.heartbeat(slots), stop=self.stopped
            )
        except ApiError as exc:
            log.error("heartbeat refused: %s", exc)
            return agent.session.heartbeat_interval
        assert answer is not None  # no done_if: every answer is a session
        agent.session.apply(answer)
        for attempt_id in answer["cancelRequested"]:
            runner = agent.runner(attempt_id)
            if runner is not None:
                runner.cancel()
        if answer["rotationRequired"]:
            log.info("the operator requires a key rotation")
            try:
                rotate_key(agent)
            except (ApiError, TransportError) as exc:
                log.error("key rotation failed (the old key works until its grace period ends): %s", exc)
        return max(MIN_DELAY, seconds_between(answer["nextHeartbeatAt"], answer["serverTime"]))
