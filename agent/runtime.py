"""The headless worker's lifecycle (ADR-0012 §5): session, heartbeat, claims, attempts, shutdown.

Threads, one per concern: the main thread claims work; one heartbeat timer thread (never
overlapping itself, a daemon so it never holds the process up); one runner thread per attempt,
which owns that attempt's lease (starting ACK, running ACK, renewals just before the lease
midpoint, the completion). Nothing else runs: no timer exists before ``Agent.run`` is called.

Failure rules:

* a network cut, a control-plane restart, a 503 or a 429 is retried with full-jitter exponential
  backoff (tenacity; never sooner than a ``Retry-After``) without a new session; a renewal stops
  retrying before the lease would have lapsed, and the runner then kills its process and
  abandons the attempt — a process whose lease lapsed must not report;
* a fenced session (superseded, expired, offline …) stops everything at once, kills running
  processes and exits ``EXIT_FENCED`` (3) so the supervisor starts a fresh process and session;
* a refused credential (revoked, re-enrolled, expired) exits ``EXIT_CREDENTIAL_REFUSED`` (4) at
  once, with a message saying the machine must be re-enrolled; it is never retried, and the
  supervisor must not restart it in a loop (systemd ``RestartPreventExitStatus=4``);
* an operator-forced key rotation (``rotationRequired`` in a heartbeat answer) is carried out
  by the heartbeat thread: a new key is generated, sent signed by the current key, and saved
  before the old one is forgotten (``rotate_key``);
* SIGTERM/SIGINT: drain (capacity 0), keep heartbeating, wait for running attempts up to
  ``drain_timeout``, then go offline. A drain timeout or a failed offline exits
  ``EXIT_SHUTDOWN_FAILED`` (5) with a message; the node is never reported as safely stopped.
"""

from __future__ import annotations

import logging
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_any,
    stop_before_delay,
    stop_when_event_set,
    wait_random_exponential,
)

from protocol import wire
from protocol.ids import uuid7
from protocol.signing import public_key_text

from . import __version__
from .client import ApiError, Client, TransportError
from .executor import Execution, StartFailed
from .state import Credential, StateDir

log = logging.getLogger("qinglong.agent")

#: Seconds before the lease's estimated expiry at which a job whose lease was not renewed is
#: ended: its guard sends SIGTERM then, and SIGKILL 2 s later, so the job is gone before the
#: control plane can consider the attempt lost and dispatch it again. (At most a quarter of the
#: lease, so that the watchdog never fires between two on-time renewals at the lease midpoint.)
GUARD_MARGIN_SECONDS = 3.0


def guard_margin(lease_window: float) -> float:
    return min(GUARD_MARGIN_SECONDS, lease_window / 4)


#: How long a cancelled job gets between SIGTERM and SIGKILL (at most an eighth of the renew
#: interval). A cancellation must end the job within one renew interval of the request
#: (SIBLINGS §2, issue 5), and the worker learns of it only from a renew answer; so the agent
#: renews early by twice this grace (see :func:`renew_period`), leaving room for the grace and
#: for the renewal's round trip.
CANCEL_GRACE_SECONDS = 2.0


def cancel_grace(renew_interval: float) -> float:
    """Seconds between SIGTERM and SIGKILL when the job is cancelled (``renew_interval`` in s)."""
    return min(CANCEL_GRACE_SECONDS, renew_interval / 8)


def renew_period(renew_interval: float) -> float:
    """Seconds from one renewal's send to the next: the server's ``renewIntervalSeconds`` less
    twice the cancel grace, so that a cancellation requested just after a renewal is seen, and
    its job killed (SIGTERM, grace, SIGKILL), within one renew interval of the request."""
    return renew_interval - 2 * cancel_grace(renew_interval)

FENCED = {
    "session_superseded", "session_expired", "session_offline", "session_unknown",
    "session_generation_mismatch", "lease_session_mismatch",
}
REFUSED = {
    "credential_revoked", "credential_expired", "credential_unknown", "worker_revoked", "signature_invalid",
    "signature_path_mismatch", "principal_mismatch",
}
#: Lease answers after which the attempt is no longer ours: kill the process, report nothing.
LEASE_LOST = {"lease_expired", "lease_released", "lease_completed", "lease_token_mismatch", "lease_unknown",
              "lease_generation_mismatch"}


class Stop(Exception):
    """End the agent with ``exit_code`` and a one-line ``reason``."""

    def __init__(self, exit_code: int, reason: str) -> None:
        self.exit_code = exit_code
        self.reason = reason
        super().__init__(reason)


#: Longest honoured Retry-After, seconds (a misconfigured server must not park the agent).
MAX_RETRY_AFTER = 60.0
#: A call that keeps failing for less than this long — a control-plane restart — logs its retries
#: at INFO; past it, at WARNING (an outage someone should look at).
QUIET_RETRY_SECONDS = 15.0


def _log_retry(path: str, retry_state: RetryCallState) -> None:
    exc = retry_state.outcome.exception() if retry_state.outcome else None
    quiet = (retry_state.seconds_since_start or 0.0) < QUIET_RETRY_SECONDS
    log.log(logging.INFO if quiet else logging.WARNING, "retrying %s: %s", path, exc)


def _transient(exc: BaseException) -> bool:
    """Worth retrying: no answer, a 429/503, or ``signature_stale`` — the client has just
    realigned its signing clock with the server's ``Date`` (agent.client), so a re-signed
    request falls inside the window; a clock that cannot be aligned keeps being retried and
    logged, never mistaken for a refused credential."""
    return isinstance(exc, TransportError) or (
        isinstance(exc, ApiError) and (exc.status in (429, 503) or exc.code == "signature_stale")
    )


def backoff(max_seconds: float):
    """Full-jitter exponential backoff (0.5 s doubling, capped at ``max_seconds``) that never
    retries sooner than the server's ``Retry-After`` (capped at ``MAX_RETRY_AFTER``)."""
    jitter = wait_random_exponential(multiplier=0.5, max=max_seconds)

    def wait(retry_state: RetryCallState) -> float:
        delay = jitter(retry_state)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, ApiError) and exc.retry_after:
            delay = max(delay, min(exc.retry_after, MAX_RETRY_AFTER))
        return delay

    return wait


def classify(exc: ApiError) -> Stop | None:
    """The Stop an API error implies for the whole agent, or None if it is local to one call."""
    if exc.code in FENCED:
        return Stop(wire.EXIT_FENCED, f"session fenced ({exc.code}: {exc.message}); exiting with status "
                    f"{wire.EXIT_FENCED} so that the supervisor starts a fresh process, which registers a new session")
    if exc.code in REFUSED:
        return Stop(wire.EXIT_CREDENTIAL_REFUSED, f"credential refused by the control plane ({exc.code}: "
                    f"{exc.message}); this machine must be re-enrolled with a new token (qinglong-worker enroll); "
                    f"exiting with status {wire.EXIT_CREDENTIAL_REFUSED}: do not restart it in a loop")
    return None


def _seconds_between(later: str, earlier: str) -> float:
    parse = datetime.fromisoformat
    return (parse(later.replace("Z", "+00:00")) - parse(earlier.replace("Z", "+00:00"))).total_seconds()


@dataclass
class Session:
    session_id: str
    generation: int
    version: int
    state: str
    heartbeat_interval: float
    lease_seconds: float
    last_ok: float = field(default_factory=time.monotonic)

    def fence(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "generation": self.generation}


@dataclass(frozen=True)
class Settings:
    max_concurrent: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    work_dir: Path = Path("/tmp/qinglong-worker")
    drain_timeout: float = 60.0
    poll_min: float = 1.0
    poll_max: float = 5.0
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
        self.session: Session | None = None
        self._session_lock = threading.Lock()
        self._runners: dict[str, AttemptRunner] = {}
        self._runners_lock = threading.Lock()
        self._shutdown = threading.Event()
        self._stop_heartbeat = threading.Event()
        self._wake = threading.Event()
        self._fatal: Stop | None = None
        self._heartbeat_thread: threading.Thread | None = None

    # --- calls -----------------------------------------------------------------------------

    def call(self, path: str, body: dict[str, Any], *, patience: float | None = None,
             stop: threading.Event | None = None) -> dict[str, Any]:
        """POST with retries on transient failures for up to ``patience`` seconds (None: forever).

        A retry that would start after ``patience`` is not made (``stop_before_delay``), so a
        renewal never outlives its lease. Every attempt is signed afresh (new nonce, new time).
        Raises Stop for fencing/credential errors, ApiError for other refusals, TransportError
        when patience ran out.
        """
        stops = [stop_when_event_set(stop or threading.Event())]
        if patience is not None:
            stops.append(stop_before_delay(patience))
        retrying = Retrying(
            retry=retry_if_exception(_transient),
            wait=backoff(self.settings.backoff_max),
            stop=stop_any(*stops),
            reraise=True,
            before_sleep=lambda rs: _log_retry(path, rs),
        )
        try:
            return retrying(lambda: self.client.post(path, body))
        except ApiError as exc:
            verdict = classify(exc)
            if verdict is not None:
                raise verdict from exc
            raise

    def fail(self, stop: Stop) -> None:
        """Record a fatal condition (first one wins) and wake the main loop."""
        if self._fatal is None:
            self._fatal = stop
        self._shutdown.set()
        self._wake.set()

    # --- session ---------------------------------------------------------------------------

    def register(self, capabilities: dict[str, Any]) -> Session:
        session_id = str(uuid7())
        answer = self.call(wire.SESSION_REGISTER, {
            "workerId": self.credential.workerId,
            "sessionId": session_id,
            "capabilities": capabilities,
            "maxConcurrentRuns": self.settings.max_concurrent,
            "availableSlots": self.settings.max_concurrent,
            "softwareVersion": f"qinglong-worker/{__version__}",
            "protocolVersion": 1,
        }, patience=120, stop=self._shutdown)
        session = Session(
            session_id=answer["sessionId"], generation=answer["generation"], version=answer["version"],
            state=answer["state"], heartbeat_interval=answer["heartbeatIntervalSeconds"],
            lease_seconds=_seconds_between(answer["leaseExpiresAt"], answer["serverTime"]),
        )
        log.info("session %s registered: generation %s, version %s, %s%s", session.session_id,
                 session.generation, session.version, session.state,
                 " (replaced the previous session)" if answer["replacedSession"] else "")
        return session

    def _apply(self, answer: dict[str, Any]) -> None:
        with self._session_lock:
            self.session.version = answer["version"]
            self.session.state = answer["state"]
            self.session.last_ok = time.monotonic()

    def session_call(self, path: str, extra: dict[str, Any] | None = None, *, done_if: frozenset[str] = frozenset(),
                     **call: Any) -> dict[str, Any]:
        """A session call carrying ``expectedVersion`` (heartbeat, drain, offline).

        The session's version moves under the worker when an operator drains or undrains it, or
        when an earlier try of this very call committed but its answer was lost; the refusal
        (``session_version_conflict``) carries the current version, which is adopted for one more
        try. An error code in ``done_if`` means the call's goal already holds (``session_offline``
        for the offline call whose first answer was lost) and answers ``{}``.
        Raises like :meth:`call`.
        """
        for attempt in range(2):
            body = {**self.session.fence(), "expectedVersion": self.session.version, **(extra or {})}
            try:
                return self.call(path, body, **call)
            except Stop as stop:
                if isinstance(stop.__cause__, ApiError) and stop.__cause__.code in done_if:
                    return {}
                raise
            except ApiError as exc:
                if attempt or exc.code != "session_version_conflict" or "currentVersion" not in exc.details:
                    raise
                with self._session_lock:
                    self.session.version = exc.details["currentVersion"]
        raise AssertionError("unreachable")

    def _heartbeat_once(self) -> dict[str, Any]:
        slots = 0 if self._shutdown.is_set() else self.settings.max_concurrent
        return self.session_call(wire.SESSION_HEARTBEAT, {"availableSlots": slots}, stop=self._stop_heartbeat)

    def _heartbeat_loop(self) -> None:
        delay = self.session.heartbeat_interval
        while not self._stop_heartbeat.wait(delay):
            try:
                delay = self._heartbeat_step()
            except Stop as stop:
                self.fail(stop)
                return
            except TransportError:
                return  # only when stopping: call() retries forever otherwise

    def _heartbeat_step(self) -> float:
        """One heartbeat and what its answer asks for; returns the delay until the next one."""
        try:
            answer = self._heartbeat_once()
        except ApiError as exc:
            log.error("heartbeat refused: %s", exc)
            return self.session.heartbeat_interval
        self._apply(answer)
        for attempt_id in answer["cancelRequested"]:
            runner = self._runners.get(attempt_id)
            if runner is not None:
                runner.cancel()
        if answer["rotationRequired"]:
            log.info("the operator requires a key rotation")
            try:
                self.rotate_key()
            except (ApiError, TransportError) as exc:
                log.error("key rotation failed (the old key works until its grace period ends): %s", exc)
        return max(0.5, _seconds_between(answer["nextHeartbeatAt"], answer["serverTime"]))

    def rotate_key(self) -> str:
        """Rotate the worker key (ADR-0012 §2): a new Ed25519 key, sent signed by the current one.

        The rotation is retried with the *same* new key while the control plane does not answer
        (the server answers a repeated rotation as an exact replay), then the new key and
        credential are saved before the client switches to them and the old key file is
        removed. Returns the new credential id. Raises Stop when the credential is refused,
        ApiError for other refusals (``credential_superseded``), TransportError when the
        control plane stayed unreachable for 30 s.
        """
        new_key = Ed25519PrivateKey.generate()
        answer = self.call(wire.ROTATE_KEY, {"publicKey": public_key_text(new_key.public_key())}, patience=30)
        self.credential = Credential(self.credential.server, self.credential.workerId, self.credential.workerName,
                                     answer["credentialId"])
        self.state.save(self.credential, new_key)
        self.client = self.client.with_key(answer["credentialId"], new_key)
        log.info("rotated the worker key; new credential %s (the old key works until %s)", answer["credentialId"],
                 answer["previousCredentialValidUntil"])
        return answer["credentialId"]

    # --- claims ----------------------------------------------------------------------------

    def running_count(self) -> int:
        with self._runners_lock:
            return len(self._runners)

    def _claim_once(self) -> int:
        free = self.settings.max_concurrent - self.running_count()
        if free <= 0 or self.session.state != "online":
            return 0
        offers = [{"offerId": str(uuid7()), "leaseToken": secrets.token_urlsafe(32)}
                  for _ in range(min(free, wire.MAX_OFFERS_PER_CLAIM))]
        try:
            answer = self.call(wire.CLAIM, {**self.session.fence(), "offers": offers}, stop=self._shutdown)
        except ApiError as exc:
            if exc.code == "session_draining":
                with self._session_lock:
                    self.session.state = "draining"
            elif exc.code not in ("capacity_exhausted", "rate_limited"):
                log.error("claim refused: %s", exc)
            return 0
        except TransportError:
            return 0
        tokens = {offer["offerId"]: offer["leaseToken"] for offer in offers}
        for offer in answer["offers"]:
            runner = AttemptRunner(self, offer, tokens[offer["lease"]["offerId"]])
            with self._runners_lock:
                self._runners[offer["lease"]["attemptId"]] = runner
            runner.start()
        return len(answer["offers"])

    def _claim_loop(self) -> None:
        delay = self.settings.poll_min
        while not self._shutdown.is_set():
            if self._claim_once():
                delay = self.settings.poll_min
                continue
            self._wake.wait(delay)
            self._wake.clear()
            delay = min(self.settings.poll_max, delay * 1.5)

    def runner_done(self, attempt_id: str) -> None:
        with self._runners_lock:
            self._runners.pop(attempt_id, None)
        self._wake.set()

    # --- lifecycle -------------------------------------------------------------------------

    def request_shutdown(self, *_: Any) -> None:
        if not self._shutdown.is_set():
            log.info("shutdown requested: draining")
        self._shutdown.set()
        self._wake.set()

    def run(self, capabilities: dict[str, Any]) -> int:
        """Register, heartbeat, claim and run until told to stop; return the exit status."""
        signal.signal(signal.SIGTERM, self.request_shutdown)
        signal.signal(signal.SIGINT, self.request_shutdown)
        try:
            self.session = self.register(capabilities)
        except Stop as stop:
            log.error("registration refused: %s", stop.reason)
            return stop.exit_code
        except (ApiError, TransportError) as exc:
            log.error("registration failed: %s", exc)
            return 1
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._heartbeat_thread.start()
        try:
            self._claim_loop()
        except Stop as stop:
            self.fail(stop)
        if self._fatal is not None:
            return self._die(self._fatal)
        return self._graceful_shutdown()

    def _die(self, stop: Stop) -> int:
        self._stop_heartbeat.set()
        for runner in list(self._runners.values()):
            runner.abandon()
        log.error("stopping: %s", stop.reason)
        return stop.exit_code

    def _graceful_shutdown(self) -> int:
        try:
            answer = self.session_call(wire.SESSION_DRAIN, patience=30)
            self._apply(answer)
        except Stop as stop:
            return self._die(stop)
        except (ApiError, TransportError) as exc:
            return self._die(Stop(wire.EXIT_SHUTDOWN_FAILED, f"drain failed: {exc}"))
        log.info("draining: waiting up to %ss for %s running attempt(s)", self.settings.drain_timeout,
                 self.running_count())
        deadline = time.monotonic() + self.settings.drain_timeout
        while self.running_count() and time.monotonic() < deadline and self._fatal is None:
            self._wake.wait(0.2)
            self._wake.clear()
        if self._fatal is not None:
            return self._die(self._fatal)
        if self.running_count():
            return self._die(Stop(
                wire.EXIT_SHUTDOWN_FAILED,
                f"drain timed out after {self.settings.drain_timeout}s with {self.running_count()} attempt(s) "
                "still running; they were killed and the control plane will settle them as lost",
            ))
        self._stop_heartbeat.set()
        try:
            self.session_call(wire.SESSION_OFFLINE, patience=30, done_if=frozenset({"session_offline"}))
        except Stop as stop:
            return self._die(stop)
        except (ApiError, TransportError) as exc:
            return self._die(Stop(wire.EXIT_SHUTDOWN_FAILED, f"offline failed: {exc}"))
        log.info("offline: session %s ended cleanly", self.session.session_id)
        return 0


class AttemptRunner(threading.Thread):
    """Owns one attempt: ACKs, the process, renewals (just before the lease midpoint), completion."""

    def __init__(self, agent: Agent, offer: dict[str, Any], lease_token: str) -> None:
        super().__init__(name=f"attempt-{offer['lease']['attemptId'][:8]}", daemon=True)
        self.agent = agent
        self._token = lease_token
        self.spec = offer["execution"]
        self.lease = offer["lease"]
        self._cancel = threading.Event()
        self._abandon = threading.Event()
        self.execution: Execution | None = None

    def cancel(self) -> None:
        self._cancel.set()

    def abandon(self) -> None:
        """Kill the process without reporting (the agent is fenced or its credential refused)."""
        self._abandon.set()
        self._cancel.set()
        if self.execution is not None:
            self.execution.stop("cancelled")

    def _fence(self) -> dict[str, Any]:
        return {**self.agent.session.fence(), "attemptId": self.lease["attemptId"],
                "leaseGeneration": self.lease["leaseGeneration"], "leaseToken": self._token}

    def run(self) -> None:
        try:
            self._run()
        except Stop as stop:
            self.agent.fail(stop)
            if self.execution is not None:
                self.execution.stop("cancelled")
        except Exception:  # one attempt's bug must not take the agent down
            log.exception("attempt %s failed in the agent", self.lease["attemptId"])
            if self.execution is not None:
                self.execution.stop("cancelled")
        finally:
            self.agent.runner_done(self.lease["attemptId"])

    def _renew(self, *, patience: float) -> dict[str, Any]:
        """Renew the lease. If an earlier try's answer was lost after the server committed it,
        the retry is refused with the version that renewal produced: adopt it and renew again
        (SIBLINGS §3). Raises ApiError/TransportError/Stop like ``Agent.call``."""
        for attempt in range(2):
            body = {**self._fence(), "leaseVersion": self.lease["leaseVersion"]}
            try:
                return self.agent.call(wire.LEASE_RENEW, body, patience=patience)
            except ApiError as exc:
                current = exc.details.get("currentVersion")
                if attempt or exc.code != "lease_version_conflict" or not isinstance(current, int) \
                        or current <= self.lease["leaseVersion"]:
                    raise
                self.lease = {**self.lease, "leaseVersion": current}
        raise AssertionError("unreachable")

    def _ack(self, path: str, extra: dict[str, Any], patience: float) -> dict[str, Any]:
        body = {**self._fence(), "offerId": self.lease["offerId"], "leaseVersion": self.lease["leaseVersion"], **extra}
        return self.agent.call(path, body, patience=patience)

    def _run(self) -> None:
        spec, attempt_id = self.spec, self.lease["attemptId"]
        log.info("attempt %s: run %s #%s (%s, timeout %ss)", attempt_id, spec["runId"], spec["attemptNumber"],
                 spec["executor"], spec["timeoutSeconds"])
        lease_window = 2 * self.lease["renewIntervalSeconds"]
        # The starting ACK sets the lease to expire one TTL after the server handles it, which is
        # after we send it: measuring from the send keeps our estimate on the early side.
        sent = time.monotonic()
        try:
            started = self._ack(wire.LEASE_STARTING, {}, patience=lease_window / 2)
        except (ApiError, TransportError) as exc:
            log.error("attempt %s: starting ACK refused, not starting: %s", attempt_id, exc)
            return
        if started["cancelRequested"]:
            self._ack(wire.LEASE_START_FAILED, {"reason": "cancelled"}, patience=lease_window / 2)
            log.info("attempt %s: cancelled before it started", attempt_id)
            return
        lease_deadline = sent + lease_window
        try:
            self.execution = Execution(executor=spec["executor"], command=spec["command"], env=spec["env"],
                                       timeout_seconds=spec["timeoutSeconds"], work_dir=self.agent.settings.work_dir,
                                       kill_in=lease_deadline - guard_margin(lease_window) - time.monotonic(),
                                       user=self.agent.settings.job_user)
        except StartFailed as exc:
            log.error("attempt %s: could not start: %s", attempt_id, exc)
            self._ack(wire.LEASE_START_FAILED, {"reason": "executor_start_failed"}, patience=lease_window / 2)
            return
        execution = self.execution
        try:
            running = self._ack(wire.LEASE_RUNNING, {"pid": execution.pid, "pgid": execution.pid,
                                                     "executorHandle": execution.handle}, patience=lease_window / 2)
        except (ApiError, TransportError) as exc:
            log.error("attempt %s: running ACK refused; stopping the process: %s", attempt_id, exc)
            execution.stop("cancelled")
            return
        self.lease = running["lease"]
        next_renew = sent + renew_period(self.lease["renewIntervalSeconds"])
        if running["cancelRequested"]:
            self._cancel.set()
        while True:
            step = min(1.0, next_renew - time.monotonic(), execution.deadline - time.monotonic())
            if execution.wait(step):
                break
            now = time.monotonic()
            if self._cancel.is_set():
                execution.stop("cancelled", cancel_grace(self.lease["renewIntervalSeconds"]))
                break
            if now >= execution.deadline:
                execution.stop("timed_out")
                break
            if now >= next_renew:
                sent = time.monotonic()
                try:
                    renewed = self._renew(patience=max(0.0, lease_deadline - sent - guard_margin(lease_window)))
                except (ApiError, TransportError) as exc:
                    log.error("attempt %s: lease lost (%s); killing the process, not reporting", attempt_id, exc)
                    execution.stop("cancelled")
                    return
                self.lease = renewed["lease"]
                lease_deadline = sent + lease_window
                execution.kill_in(lease_deadline - guard_margin(lease_window) - time.monotonic())
                next_renew = sent + renew_period(self.lease["renewIntervalSeconds"])
                if renewed["cancelRequested"]:
                    # Kill now, not after the next wait step: the kill must land within one
                    # renew interval of the cancellation.
                    self._cancel.set()
                    execution.stop("cancelled", cancel_grace(self.lease["renewIntervalSeconds"]))
                    break
        result = execution.result()
        if self._abandon.is_set():
            return
        completion = {**self._fence(), "sequence": 1, "outcome": result.outcome, "exitCode": result.exit_code,
                      "stdoutTail": result.stdout_tail, "stderrTail": result.stderr_tail}
        try:
            answer = self.agent.call(wire.LEASE_COMPLETE, completion,
                                     patience=max(1.0, lease_deadline - time.monotonic()))
        except (ApiError, TransportError) as exc:
            log.error("attempt %s: completion not accepted: %s", attempt_id, exc)
            return
        log.info("attempt %s: %s (exit %s)", attempt_id, answer["outcome"], result.exit_code)
