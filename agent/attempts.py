"""Running one attempt: one thread per attempt, owning that attempt's run lease.

The runner sends the starting ACK, starts the process (``agent.executor``, under its guard),
sends the running ACK, renews the lease just before its midpoint, and reports the completion.
Timing rules (docs/leases.md):

* the lease's expiry is estimated from when each ACK or renewal was *sent* (the server sets it
  one TTL after it handles the call, which is later), so the estimate errs early;
* after every renewal the guard's watchdog is moved to ``GUARD_MARGIN_SECONDS`` before that
  estimate: an agent that cannot renew (paused, hung, cut off) has its job ended before the
  control plane can consider the attempt lost and dispatch it again;
* the hard deadline (docs/leases.md, Hard deadline) is the lease's estimated expiry plus the
  task's ``lostAfterSeconds`` (the execution spec's; 0 from a server that sends none): while a
  renewal gets *no answer* (no connection, a timeout, a 5xx, a 503 with ``Retry-After``) it is
  retried, and the job keeps running, until ``GUARD_MARGIN_SECONDS`` before that deadline; the
  guard's watchdog is set to the same moment, measured on this machine's monotonic clock from
  the last renewal that succeeded. The control plane hands the attempt to a retry only after the
  same deadline by its clock, which is later. An *explicit refusal* (409 ``lease_expired``,
  ``lease_released``…, 401, 403) ends the job at once. Either way the runner kills its process
  and abandons the attempt — a process whose lease is gone must not report;
* a cancellation is learned from the waiting claim's answer (pushed, within milliseconds of the
  request), or from an ACK, renewal or heartbeat answer; the job's group gets SIGTERM at once
  (``cancel``), SIGKILL after ``cancel_grace`` — within one renew interval of the request even
  without a waiting claim;
* the job's output is shipped live under the lease (``agent.output``); after the job ends the
  rest of the log is sent and the declared artifacts uploaded (``agent.artifacts``), still
  renewing, and only then is the completion reported (docs/logs.md);
* each attempt runs in a work directory of its own, ``<work dir>/<attempt id>`` (the job's cwd,
  where its artifact globs are matched), removed once the artifacts were uploaded and the
  completion reported, so concurrent attempts never see each other's files.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from protocol import messages as m
from protocol import wire
from protocol.masking import secret_values

from .artifacts import upload_all
from .calls import Stop
from .client import ApiError, TransportError
from .executor import Execution, StartFailed
from .output import LogShipper, OutputBuffer

if TYPE_CHECKING:
    from .runtime import Agent

log = logging.getLogger("qinglong.agent")

#: Seconds before the lease's estimated expiry at which a job whose lease was not renewed is
#: ended: its guard sends SIGTERM then, and SIGKILL 2 s later, so the job is gone before the
#: control plane can consider the attempt lost and dispatch it again. (At most a quarter of the
#: lease, so that the watchdog never fires between two on-time renewals at the lease midpoint.)
GUARD_MARGIN_SECONDS = 3.0

#: How long a cancelled job gets between SIGTERM and SIGKILL (at most an eighth of the renew
#: interval). A cancellation must end the job within one renew interval of the request, and the
#: worker learns of it only from a renew answer; so the agent renews early by twice this grace
#: (see :func:`renew_period`), leaving room for the grace and for the renewal's round trip.
CANCEL_GRACE_SECONDS = 2.0

#: Longest time after the job's end spent sending the rest of its log (seconds); the lease is
#: renewed meanwhile, and whatever is still unsent after it is lost (the completion matters more).
OUTPUT_FLUSH_SECONDS = 60.0


def guard_margin(lease_window: float) -> float:
    """Seconds before the estimated lease expiry at which the guard ends an unrenewed job."""
    return min(GUARD_MARGIN_SECONDS, lease_window / 4)


def cancel_grace(renew_interval: float) -> float:
    """Seconds between SIGTERM and SIGKILL when the job is cancelled (``renew_interval`` in s)."""
    return min(CANCEL_GRACE_SECONDS, renew_interval / 8)


def renew_period(renew_interval: float) -> float:
    """Seconds from one renewal's send to the next: the server's ``renewIntervalSeconds`` less
    twice the cancel grace, so that a cancellation requested just after a renewal is seen, and
    its job killed (SIGTERM, grace, SIGKILL), within one renew interval of the request."""
    return renew_interval - 2 * cancel_grace(renew_interval)


class AttemptRunner(threading.Thread):
    """Owns one attempt: ACKs, the process, renewals (just before the lease midpoint), completion."""

    def __init__(self, agent: Agent, offer: m.Offer, lease_token: str) -> None:
        super().__init__(name=f"attempt-{offer['lease']['attemptId'][:8]}", daemon=True)
        self.agent = agent
        self._token = lease_token
        self.spec = offer["execution"]
        self.lease = offer["lease"]
        self._cancel = threading.Event()
        self._abandon = threading.Event()
        #: Set once the starting ACK was answered or given up on (the claim loop's next request
        #: waits for it, so that the ACK does not queue behind it at the control plane).
        self.acknowledged = threading.Event()
        #: Set when this attempt's completion started the next attempt in its slot (its next claim).
        self.refilled = False
        self.execution: Execution | None = None
        #: This attempt's own work directory: the job's cwd and the root of its artifact globs.
        self.work_dir = agent.settings.work_dir / str(uuid.UUID(offer["lease"]["attemptId"]))
        # Secret env values are masked before anything is sent (protocol/masking.py).
        self.output = OutputBuffer(secrets=secret_values(self.spec["env"], self.spec.get("secretEnv", [])))
        self.shipper = LogShipper(self.output, self._send_log, name=f"log-{offer['lease']['attemptId'][:8]}")
        self._lease_window = 2.0 * self.lease["renewIntervalSeconds"]
        self._lease_deadline = 0.0
        self._lost_after = 0.0  # the spec's lostAfterSeconds, set when the attempt starts
        self._next_renew = 0.0

    def cancel(self) -> None:
        """The control plane asked to cancel: the job's process group gets its stop signal now
        (from whichever thread learned it: a waiting claim, a heartbeat, a lease answer); the
        runner then waits for it to end and completes ``cancelled``."""
        self._cancel.set()
        execution = self.execution
        if execution is not None:
            execution.signal_stop("cancelled", cancel_grace(self.lease["renewIntervalSeconds"]))

    @property
    def cancelling(self) -> bool:
        return self._cancel.is_set()

    def abandon(self) -> None:
        """Kill the process without reporting (the agent is fenced or its credential refused)."""
        self._abandon.set()
        self._cancel.set()
        self.shipper.stop()
        if self.execution is not None:
            self.execution.stop("cancelled")

    def _fence(self) -> m.LeaseFence:
        return {
            **self.agent.session.fence(),
            "attemptId": self.lease["attemptId"],
            "leaseGeneration": self.lease["leaseGeneration"],
            "leaseToken": self._token,
        }

    def _send_log(self, body: Mapping[str, object], patience: float) -> dict[str, Any]:
        return self.agent.call(wire.LOG_APPEND, {**self._fence(), **body}, patience=patience)

    def _send_artifact(self, body: Mapping[str, object]) -> dict[str, Any]:
        patience = max(1.0, self._lease_deadline - time.monotonic() - guard_margin(self._lease_window))
        return self.agent.call(wire.ARTIFACT_UPLOAD, {**self._fence(), **body}, patience=patience)

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
            self.acknowledged.set()
            self.shipper.stop()
            # The artifacts were uploaded and the completion reported (or the attempt abandoned,
            # its process stopped): nothing of this attempt needs its files any more.
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.agent.runner_done(self.lease["attemptId"], refilled=self.refilled)

    def _renew(self, *, patience: float) -> m.AckAnswer:
        """Renew the lease. If an earlier try's answer was lost after the server committed it,
        the retry is refused with the version that renewal produced: adopt it and renew again.
        Raises ApiError/TransportError/Stop like ``Agent.call``."""
        for attempt in range(2):
            body: m.VersionedLease = {**self._fence(), "leaseVersion": self.lease["leaseVersion"]}
            try:
                return cast(m.AckAnswer, self.agent.call(wire.LEASE_RENEW, body, patience=patience))
            except ApiError as exc:
                current = exc.details.get("currentVersion")
                if (
                    attempt
                    or exc.code != "lease_version_conflict"
                    or not isinstance(current, int)
                    or current <= self.lease["leaseVersion"]
                ):
                    raise
                self.lease = {**self.lease, "leaseVersion": current}
        raise AssertionError("unreachable")

    def _ack(self) -> m.Ack:
        return {**self._fence(), "offerId": self.lease["offerId"], "leaseVersion": self.lease["leaseVersion"]}

    def _send(self, path: str, body: m.Ack, patience: float) -> m.AckAnswer:
        return cast(m.AckAnswer, self.agent.call(path, body, patience=patience))

    def _start_failed(self, reason: str, patience: float) -> None:
        body: m.StartFailed = {**self._ack(), "reason": reason}
        self._send(wire.LEASE_START_FAILED, body, patience)

    def _run(self) -> None:
        spec, attempt_id = self.spec, self.lease["attemptId"]
        log.info(
            "attempt %s: run %s #%s (%s, timeout %ss)",
            attempt_id,
            spec["runId"],
            spec["attemptNumber"],
            spec["executor"],
            spec["timeoutSeconds"],
        )
        lease_window = 2 * self.lease["renewIntervalSeconds"]
        # How long past the lease's expiry the job may ride out a control plane that does not
        # answer (docs/leases.md, Hard deadline); the server waits at least as long to retry it.
        lost_after = self._lost_after = float(spec.get("lostAfterSeconds") or 0)
        # The starting ACK sets the lease to expire one TTL after the server handles it, which is
        # after we send it: measuring from the send keeps our estimate on the early side.
        sent = time.monotonic()
        try:
            started = self._send(wire.LEASE_STARTING, self._ack(), patience=lease_window / 2)
        except (ApiError, TransportError) as exc:
            log.error("attempt %s: starting ACK refused, not starting: %s", attempt_id, exc)
            return
        finally:
            self.acknowledged.set()
        if started["cancelRequested"]:
            self._start_failed("cancelled", patience=lease_window / 2)
            log.info("attempt %s: cancelled before it started", attempt_id)
            return
        lease_deadline = sent + lease_window
        try:
            self.execution = Execution(
                executor=spec["executor"],
                command=spec["command"],
                env=spec["env"],
                timeout_seconds=spec["timeoutSeconds"],
                work_dir=self.work_dir,
                kill_in=lease_deadline + lost_after - guard_margin(lease_window) - time.monotonic(),
                user=self.agent.settings.job_user,
                output=self.output,
            )
        except StartFailed as exc:
            log.error("attempt %s: could not start: %s", attempt_id, exc)
            self._start_failed("executor_start_failed", patience=lease_window / 2)
            return
        execution = self.execution
        running_ack: m.RunningAck = {
            **self._ack(),
            "pid": execution.pid,
            "pgid": execution.pid,
            "executorHandle": execution.handle,
        }
        try:
            running = self._send(wire.LEASE_RUNNING, running_ack, patience=lease_window / 2)
        except (ApiError, TransportError) as exc:
            log.error("attempt %s: running ACK refused; stopping the process: %s", attempt_id, exc)
            execution.stop("cancelled")
            return
        self.lease = running["lease"]
        self.shipper.start()
        next_renew = sent + renew_period(self.lease["renewIntervalSeconds"])
        if running["cancelRequested"] or self._cancel.is_set():
            self.cancel()
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
                    renewed = self._renew(
                        patience=max(0.0, lease_deadline + lost_after - sent - guard_margin(lease_window))
                    )
                except (ApiError, TransportError) as exc:
                    log.error(
                        "attempt %s: lease lost (%s); killing the process, not reporting", attempt_id, exc
                    )
                    execution.stop("cancelled")
                    return
                self.lease = renewed["lease"]
                lease_deadline = sent + lease_window
                execution.kill_in(lease_deadline + lost_after - guard_margin(lease_window) - time.monotonic())
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
        self._lease_deadline, self._next_renew = lease_deadline, next_renew
        if not self._settle_output(execution):
            return
        lease_deadline = self._lease_deadline
        claims = self.agent.claims
        offers = claims.next_offers()
        completion = cast(
            m.Complete,
            {
                **self._fence(),
                "sequence": 1,
                "outcome": result.outcome,
                "exitCode": result.exit_code,
                "stdoutTail": result.stdout_tail,
                "stderrTail": result.stderr_tail,
                **({"next": {"offers": offers}} if offers else {}),
            },
        )
        try:
            answer = self._complete(completion, lease_deadline + lost_after)
        except (ApiError, TransportError) as exc:
            log.error("attempt %s: completion not accepted: %s", attempt_id, exc)
            return
        log.info("attempt %s: %s (exit %s)", attempt_id, answer["outcome"], result.exit_code)
        if "next" in completion:
            self.refilled = claims.take_next(answer.get("next"), offers) > 0

    def _complete(self, completion: m.Complete, deadline: float) -> m.CompleteAnswer:
        """Send the completion, retried until ``deadline`` (the hard deadline, ``time.monotonic``).
        A control plane that refuses its ``next`` claim as an unknown field (an older one) gets it
        again without, and no completion carries one from then on. Raises like ``Agent.call``."""

        def send() -> m.CompleteAnswer:
            patience = max(1.0, deadline - time.monotonic())
            return cast(m.CompleteAnswer, self.agent.call(wire.LEASE_COMPLETE, completion, patience=patience))

        try:
            return send()
        except ApiError as exc:
            if "next" not in completion or exc.code != "validation_failed" or exc.field != "next":
                raise
        log.info("the control plane takes no next claim with a completion: claiming separately from now on")
        self.agent.claims.next_claims = False
        del completion["next"]
        return send()

    def _settle_output(self, execution: Execution) -> bool:
        """After the job: send the rest of its log, then upload its declared artifacts, renewing
        the lease when due. False when the lease was lost (nothing more may be reported)."""
        done = threading.Event()

        def work() -> None:
            try:
                execution.drained(2.0)
                self.shipper.finish(OUTPUT_FLUSH_SECONDS)
                outputs = self.spec.get("outputs")
                if outputs and not self.shipper.lost and not self._abandon.is_set():
                    upload_all(self.work_dir, outputs, self._send_artifact)
            except Stop as stop:
                self.agent.fail(stop)
                self._abandon.set()
            except Exception:  # one attempt's output must not take the completion down
                log.exception("attempt %s: output not settled", self.lease["attemptId"])
            finally:
                done.set()

        threading.Thread(target=work, name=f"settle-{self.lease['attemptId'][:8]}", daemon=True).start()
        while not done.wait(0.2):
            if self._abandon.is_set():
                return False
            if time.monotonic() < self._next_renew:
                continue
            sent = time.monotonic()
            try:
                renewed = self._renew(
                    patience=max(
                        0.0,
                        self._lease_deadline + self._lost_after - sent - guard_margin(self._lease_window),
                    )
                )
            except (ApiError, TransportError) as exc:
                log.error(
                    "attempt %s: lease lost while sending its output (%s)", self.lease["attemptId"], exc
                )
                self.shipper.stop()
                return False
            self.lease = renewed["lease"]
            self._lease_deadline = sent + self._lease_window
            self._next_renew = sent + renew_period(self.lease["renewIntervalSeconds"])
        return not self._abandon.is_set()
