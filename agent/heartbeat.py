"""The heartbeat loop: one timer thread that keeps the session lease alive and hears the server.

One heartbeat at a time (a loop, never overlapping itself), on a daemon thread so it never holds
the process up. Each answer carries the session's version and state (adopted), the attempts
whose cancellation was requested (their runners are told) and whether the operator requires a
key rotation (carried out here: ``agent.rotation``). The slots offered drop to 0 once shutdown
is requested; the loop keeps running while the agent drains (from the version the drain's
answer carries) and stops, its last heartbeat answered, before the agent goes offline.
A fenced session or a refused credential stops the agent (``Agent.fail``).

While waiting claims follow one another they keep the session alive instead (the server extends
the lease at each wait's start, docs/sessions.md "Waiting claims keep the session alive"): the
claim loop pushes the next heartbeat back past the wait (:meth:`Heartbeat.postpone`) and hands
each wait's session answer over (:meth:`Heartbeat.apply`); a wait that fails — already its
first try not answered, while the call still retries — brings the heartbeat back at once
(:meth:`Heartbeat.resume`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from protocol import messages as m
from protocol import wire

from .calls import Stop, transient
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
        self._changed = threading.Condition()
        self._due = 0.0
        self._held = False
        self._in_flight = False
        #: Set while held or stopped: a heartbeat's retries end (its backoff cut short), so no
        #: retry carrying the version from before a drain is sent after it.
        self._quiet = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def stop(self, wait: float = 0.0) -> None:
        """End the loop; with ``wait`` (seconds), also wait up to that long for a heartbeat in
        flight to be answered, so that a session call sent next (offline) never races it."""
        self.stopped.set()
        self._quiet.set()
        self._settle(wait)

    def hold(self, wait: float) -> None:
        """No heartbeat until :meth:`resume`, and wait up to ``wait`` seconds for one in flight:
        a session call sent next (the drain) then never races a heartbeat carrying the version
        it is about to change. A heartbeat being retried sends no further try."""
        with self._changed:
            self._held = True
            self._quiet.set()
        self._settle(wait)

    def _settle(self, wait: float) -> None:
        with self._changed:
            self._changed.notify_all()
            deadline = time.monotonic() + wait
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)

    def postpone(self, seconds: float) -> None:
        """No heartbeat for ``seconds`` from now (a waiting claim keeps the session alive)."""
        with self._changed:
            self._due = max(self._due, time.monotonic() + seconds)

    def resume(self) -> None:
        """Heartbeat now, held or not: no waiting claim is keeping the session alive any more."""
        with self._changed:
            self._held = False
            if not self.stopped.is_set():
                self._quiet.clear()
            self._due = min(self._due, time.monotonic())
            self._changed.notify_all()

    def _sleep(self) -> bool:
        """Sleep until the next heartbeat is due and mark it in flight; False once stopped."""
        with self._changed:
            while not self.stopped.is_set():
                left = self._due - time.monotonic()
                if left <= 0 and not self._held:
                    self._in_flight = True
                    return True
                self._changed.wait(None if self._held else left)
        return False

    def _loop(self) -> None:
        self.postpone(self.agent.session.heartbeat_interval)
        while self._sleep():
            try:
                delay = self.step()
            except Stop as stop:
                self.agent.fail(stop)
                return
            except TransportError:
                if self.stopped.is_set():
                    return
                delay = 0.0  # held while it was retried: beat again as soon as resumed
            finally:
                with self._changed:
                    self._in_flight = False
                    self._changed.notify_all()
            with self._changed:
                # A waiting claim that began while this heartbeat was in flight postponed the next
                # one past its wait: that postponement stands (an idle agent's only requests are
                # then its waits, about two a minute).
                self._due = max(self._due, time.monotonic() + delay)

    def step(self) -> float:
        """One heartbeat and what its answer asks for; returns the delay until the next one."""
        agent = self.agent
        slots = 0 if agent.shutdown_requested.is_set() else agent.settings.max_concurrent
        try:
            answer = session_call(
                agent, wire.SESSION_HEARTBEAT, lambda session: session.heartbeat(slots), stop=self._quiet
            )
        except ApiError as exc:
            if self._quiet.is_set() and transient(exc):
                return 0.0  # held or stopped while it was retried (a 429/503): not a refusal
            log.error("heartbeat refused: %s", exc)
            return agent.session.heartbeat_interval
        assert answer is not None  # no done_if: every answer is a session
        self.apply(answer)
        return max(MIN_DELAY, seconds_between(answer["nextHeartbeatAt"], answer["serverTime"]))

    def apply(self, answer: m.SessionAnswer) -> None:
        """What a session answer asks for (a heartbeat's or a waiting claim's): adopt its version
        and state, tell the runners of cancelled attempts, rotate the key when required."""
        agent = self.agent
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
