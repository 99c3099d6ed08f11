"""The headless worker's lifecycle (ADR-0012 §5): register, heartbeat, claim, run, shut down.

:class:`Agent` holds what the loops share (the client, the credential, the session, the attempt
runners) and starts and stops them; each loop lives in its own module:

* ``agent.session`` — registration and the session calls (heartbeat, drain, offline);
* ``agent.heartbeat`` — one heartbeat timer thread (a daemon; never overlapping itself);
* ``agent.claims`` — the claim loop, on the main thread;
* ``agent.attempts`` — one runner thread per attempt, owning that attempt's lease;
* ``agent.calls`` — retries and what a refusal means for the agent (``docs/errors.md``).

Nothing runs before :meth:`Agent.run` is called. Two events steer the loops:
``shutdown_requested`` (SIGTERM/SIGINT, or a fatal answer) ends the claim loop and makes the
heartbeat offer no slots; the heartbeat's own ``stopped`` event ends it just before the agent
goes offline, or at once when the agent dies. ``wake`` cuts the claim loop's idle wait short.

* A fenced session (superseded, expired, offline …) or a refused credential (revoked,
  re-enrolled, expired) stops everything at once: running processes are killed, nothing is
  reported, and the agent exits ``EXIT_FENCED`` (3) — the supervisor starts a fresh process
  and session — or ``EXIT_CREDENTIAL_REFUSED`` (4), with a message that the machine must be
  re-enrolled; the supervisor must not restart it in a loop (systemd
  ``RestartPreventExitStatus=4``).
* SIGTERM/SIGINT: drain (capacity 0), keep heartbeating, wait for running attempts up to
  ``drain_timeout``, then go offline. A drain timeout or a failed offline exits
  ``EXIT_SHUTDOWN_FAILED`` (5) with a message; the node is never reported as safely stopped.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from protocol import wire

from . import calls
from .attempts import AttemptRunner
from .calls import Stop
from .claims import Claims
from .client import ApiError, Client, TransportError
from .heartbeat import Heartbeat
from .session import Session, register, session_call
from .state import Credential, StateDir

log = logging.getLogger("qinglong.agent")

#: Seconds the drain and the offline call keep retrying while the control plane does not answer.
SHUTDOWN_PATIENCE = 30.0


@dataclass(frozen=True)
class Settings:
    max_concurrent: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    work_dir: Path = Path("/tmp/qinglong-worker")
    drain_timeout: float = 60.0
    poll_min: float = 1.0
    poll_max: float = 5.0
    #: Claim by long poll (``claim/wait``; the server bounds the wait), else short polling.
    long_poll: bool = True
    #: The wait a long poll asks for, seconds (the server grants at most its own bound).
    wait_seconds: float = 30.0
    #: Longest wait between two retries of a call the control plane did not answer, seconds.
    backoff_max: float = 8.0
    #: Run every job as this user (the agent runs as root), out of reach of the agent's processes.
    job_user: str | None = None


class Agent:
    def __init__(self, client: Client, credential: Credential, state: StateDir, settings: Settings) -> None:
        self.client = client
        self.credential = credential
        self.state = state
        self.settings = settings
        self._session: Session | None = None
        self._runners: dict[str, AttemptRunner] = {}
        self._runners_lock = threading.Lock()
        self.shutdown_requested = threading.Event()
        self.wake = threading.Event()
        self._fatal: Stop | None = None
        self.heartbeat = Heartbeat(self)
        self.claims = Claims(self)

    @property
    def session(self) -> Session:
        """The registered session (only once :meth:`run` has registered it)."""
        if self._session is None:
            raise RuntimeError("no session: the agent has not registered")
        return self._session

    @session.setter
    def session(self, session: Session) -> None:
        self._session = session

    # --- calls -----------------------------------------------------------------------------

    def call(
        self,
        path: str,
        body: Mapping[str, object] | Callable[[], Mapping[str, object]],
        *,
        patience: float | None = None,
        stop: threading.Event | None = None,
        timeout: float | None = None,
        interruptible: bool = False,
        on_retry: Callable[[], None] | None = None,
        before_try: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """POST with the retry policy of ``agent.calls`` (see :func:`agent.calls.call`)."""
        return calls.call(
            self.client,
            path,
            body,
            backoff_max=self.settings.backoff_max,
            patience=patience,
            stop=stop,
            timeout=timeout,
            interruptible=interruptible,
            on_retry=on_retry,
            before_try=before_try,
        )

    def fail(self, stop: Stop) -> None:
        """Record a fatal condition (first one wins) and wake the main loop."""
        if self._fatal is None:
            self._fatal = stop
        self.shutdown_requested.set()
        self.wake.set()
        self.claims.interrupt(watch_only=False)

    # --- attempt runners -------------------------------------------------------------------

    def running_count(self) -> int:
        with self._runners_lock:
            return len(self._runners)

    def runner(self, attempt_id: str) -> AttemptRunner | None:
        return self._runners.get(attempt_id)

    def watched_attempts(self) -> list[str]:
        """Running attempts whose cancellation a waiting claim should watch for (not yet cancelled)."""
        with self._runners_lock:
            return [attempt for attempt, runner in self._runners.items() if not runner.cancelling][:64]

    def start_runner(self, runner: AttemptRunner) -> None:
        with self._runners_lock:
            self._runners[runner.lease["attemptId"]] = runner
        runner.start()

    def runner_done(self, attempt_id: str, *, refilled: bool = False) -> None:
        """A runner ended; ``refilled`` when its completion's next claim already started an
        attempt in its slot (nothing for the claim loop to offer then)."""
        with self._runners_lock:
            self._runners.pop(attempt_id, None)
        self.wake.set()
        if not refilled:
            self.claims.interrupt(watch_only=True)  # a watch without offers: offer the freed slot now

    # --- lifecycle -------------------------------------------------------------------------

    def request_shutdown(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        if not self.shutdown_requested.is_set():
            log.info("shutdown requested: draining")
        self.shutdown_requested.set()
        self.wake.set()
        self.claims.interrupt(watch_only=False)

    def run(self, capabilities: dict[str, Any]) -> int:
        """Register, heartbeat, claim and run until told to stop; return the exit status."""
        signal.signal(signal.SIGTERM, self.request_shutdown)
        signal.signal(signal.SIGINT, self.request_shutdown)
        try:
            self.session = register(self, capabilities)
        except Stop as stop:
            log.error("registration refused: %s", stop.reason)
            return stop.exit_code
        except (ApiError, TransportError) as exc:
            log.error("registration failed: %s", exc)
            return 1
        self.heartbeat.start()
        try:
            self.claims.loop()
        except Stop as stop:
            self.fail(stop)
        if self._fatal is not None:
            return self._die(self._fatal)
        return self._graceful_shutdown()

    def _die(self, stop: Stop) -> int:
        self.heartbeat.stop()
        for runner in list(self._runners.values()):
            runner.abandon()
        log.error("stopping: %s", stop.reason)
        return stop.exit_code

    def _graceful_shutdown(self) -> int:
        self.heartbeat.hold(wait=self.client.timeout)  # none in flight while the drain is sent
        if self._fatal is not None:  # a heartbeat answered meanwhile that this session is fenced
            return self._die(self._fatal)
        try:
            # Held only while a try of the drain is in flight: between tries (the control plane
            # busy or unreachable) the heartbeat keeps the session alive.
            answer = session_call(
                self,
                wire.SESSION_DRAIN,
                patience=SHUTDOWN_PATIENCE,
                before_try=lambda: self.heartbeat.hold(wait=self.client.timeout),
                on_retry=self.heartbeat.resume,
            )
        except Stop as stop:
            return self._die(stop)
        except (ApiError, TransportError) as exc:
            return self._die(Stop(wire.EXIT_SHUTDOWN_FAILED, f"drain failed: {exc}"))
        if answer is not None:
            self.session.apply(answer)
        # No waiting claim keeps the session alive any more: heartbeats again, from the version
        # the drain left (sent before the drain's answer, one would race it and be refused).
        self.heartbeat.resume()
        self.claims.recover_cut_short()  # a draining session claims nothing new: replays only
        log.info(
            "draining: waiting up to %ss for %s running attempt(s)",
            self.settings.drain_timeout,
            self.running_count(),
        )
        deadline = time.monotonic() + self.settings.drain_timeout
        while self.running_count() and time.monotonic() < deadline and self._fatal is None:
            self.wake.wait(0.2)
            self.wake.clear()
        if self._fatal is not None:
            return self._die(self._fatal)
        if self.running_count():
            return self._die(
                Stop(
                    wire.EXIT_SHUTDOWN_FAILED,
                    f"drain timed out after {self.settings.drain_timeout}s with {self.running_count()} "
                    "attempt(s) still running; they were killed and the control plane will settle them "
                    "as lost",
                )
            )
        self.heartbeat.stop(wait=self.client.timeout)  # no heartbeat in flight past this line
        try:
            session_call(
                self, wire.SESSION_OFFLINE, patience=SHUTDOWN_PATIENCE, done_if=frozenset({"session_offline"})
            )
        except Stop as stop:
            return self._die(stop)
        except (ApiError, TransportError) as exc:
            return self._die(Stop(wire.EXIT_SHUTDOWN_FAILED, f"offline failed: {exc}"))
        log.info("offline: session %s ended cleanly", self.session.session_id)
        return 0
