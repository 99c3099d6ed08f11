"""How the agent makes one worker API call: retries, backoff, and what a refusal means for it.

* No answer, a 429/503, or a code whose worker action is ``retry`` is retried with full-jitter
  exponential backoff (tenacity), never sooner than a ``Retry-After``, for as long as the
  caller's patience allows; every try is signed afresh (new nonce, new time).
* A code whose action is ``restart`` (the session is fenced), ``stop`` (the credential is
  refused) or ``upgrade`` (the agent's version is refused) becomes a :class:`Stop` for the whole
  agent: exit ``EXIT_FENCED`` (3), ``EXIT_CREDENTIAL_REFUSED`` (4) or ``EXIT_AGENT_OUTDATED`` (6).
* Any other refusal is the caller's to handle (an :class:`~agent.client.ApiError`).

The code sets come from the catalogue in ``protocol.errors`` (``docs/errors.md``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_any,
    stop_before_delay,
    stop_when_event_set,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from protocol import wire
from protocol.errors import WorkerAction, codes_with

from .client import ApiError, TransportError

log = logging.getLogger("qinglong.agent")

#: Answers that fence this session: the process must stop, a new one registers a new session.
FENCED_CODES = codes_with(WorkerAction.RESTART)
#: Answers that refuse the credential: exit and do not restart in a loop.
REFUSED_CODES = codes_with(WorkerAction.STOP)
#: Answers that refuse this agent's version: exit and be upgraded, not restarted.
UPGRADE_CODES = codes_with(WorkerAction.UPGRADE)
#: Lease answers after which the attempt is no longer ours: kill the process, report nothing.
LEASE_LOST_CODES = codes_with(WorkerAction.ABANDON_ATTEMPT)
#: Codes retried like a missing answer (besides any 429/503 status).
RETRIED_CODES = codes_with(WorkerAction.RETRY)

#: Longest honoured Retry-After, seconds (a misconfigured server must not park the agent).
MAX_RETRY_AFTER = 60.0


class Stop(Exception):
    """End the agent with ``exit_code`` and a one-line ``reason``."""

    def __init__(self, exit_code: int, reason: str) -> None:
        self.exit_code = exit_code
        self.reason = reason
        super().__init__(reason)


class Poster(Protocol):
    """What a call needs of the client (``agent.client.Client``)."""

    def post(
        self,
        path: str,
        body: Mapping[str, object],
        *,
        timeout: float | None = None,
        interruptible: bool = False,
    ) -> dict[str, Any]: ...


def transient(exc: BaseException) -> bool:
    """Worth retrying: no answer, a 429/503, or a ``retry`` code such as ``signature_stale`` —
    the client has just realigned its signing clock with the server's ``Date`` (agent.client),
    so a re-signed request falls inside the window; a clock that cannot be aligned keeps being
    retried and logged, never mistaken for a refused credential."""
    return isinstance(exc, TransportError) or (
        isinstance(exc, ApiError) and (exc.status in (429, 503) or exc.code in RETRIED_CODES)
    )


def backoff(max_seconds: float) -> Callable[[RetryCallState], float]:
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
    if exc.code in FENCED_CODES:
        return Stop(
            wire.EXIT_FENCED,
            f"session fenced ({exc.code}: {exc.message}); exiting with status {wire.EXIT_FENCED} so that "
            "the supervisor starts a fresh process, which registers a new session",
        )
    if exc.code in REFUSED_CODES:
        return Stop(
            wire.EXIT_CREDENTIAL_REFUSED,
            f"credential refused by the control plane ({exc.code}: {exc.message}); this machine must be "
            "re-enrolled with a new token (qinglong-worker enroll); exiting with status "
            f"{wire.EXIT_CREDENTIAL_REFUSED}: do not restart it in a loop",
        )
    if exc.code in UPGRADE_CODES:
        return Stop(
            wire.EXIT_AGENT_OUTDATED,
            f"the control plane refuses this agent version ({exc.code}: {exc.message}); upgrade it; "
            f"exiting with status {wire.EXIT_AGENT_OUTDATED}: do not restart it in a loop",
        )
    return None


#: A call that keeps failing for less than this long — a control-plane restart, even a slow one on
#: a loaded host — logs its retries at INFO; past it, at WARNING (an outage someone should look
#: at). The standalone session lease (30 s) is as long: a shorter outage keeps the session.
QUIET_RETRY_SECONDS = 30.0


def _log_retry(path: str, on_retry: Callable[[], None] | None = None) -> Callable[[RetryCallState], None]:
    def before_sleep(retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if on_retry is not None:
            on_retry()
        quiet = (retry_state.seconds_since_start or 0.0) < QUIET_RETRY_SECONDS
        log.log(logging.INFO if quiet else logging.WARNING, "retrying %s: %s", path, exc)

    return before_sleep


def _sleep_unless(stopped: threading.Event, seconds: float) -> None:
    stopped.wait(seconds)


def call(
    client: Poster,
    path: str,
    body: Mapping[str, object] | Callable[[], Mapping[str, object]],
    *,
    backoff_max: float,
    patience: float | None = None,
    stop: threading.Event | None = None,
    timeout: float | None = None,
    interruptible: bool = False,
    on_retry: Callable[[], None] | None = None,
    before_try: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """POST with retries on transient failures for up to ``patience`` seconds (None: forever).

    ``body``: the JSON object, or a function that builds it for each try (a session call then
    carries the session's version as it is when the try is sent). ``timeout`` and
    ``interruptible`` are passed to the client for each try (a long poll).
    ``on_retry`` is called after each try that failed transiently (no answer, a timeout, a
    429/503), before the backoff: a waiting claim resumes the heartbeat there (docs/sessions.md).
    ``before_try`` is called before each try, the first included (the drain holds the heartbeat
    there, and ``on_retry`` lets it beat again during the backoff).

    A retry that would start after ``patience`` is not made (``stop_before_delay``), so a
    renewal never outlives its lease. A set ``stop`` event ends the retries too: it cuts the
    backoff short and no further try is sent, so a call told to stop never sends a body built
    before the stop (the caller gets the last try's failure). Raises Stop for fencing/credential
    errors, ApiError for other refusals, TransportError when patience ran out or ``stop`` was set.
    """
    stopped = stop or threading.Event()
    stops: list[stop_base] = [stop_when_event_set(stopped)]
    if patience is not None:
        stops.append(stop_before_delay(patience))
    retrying = Retrying(
        retry=retry_if_exception(transient),
        wait=backoff(backoff_max),
        stop=stop_any(*stops),
        sleep=lambda seconds: _sleep_unless(stopped, seconds),  # a stop set during the backoff ends it
        reraise=True,
        before=lambda state: before_try() if before_try is not None else None,
        before_sleep=_log_retry(path, on_retry),
    )
    failed: list[BaseException] = []

    def post() -> dict[str, Any]:
        if failed and stopped.is_set():
            raise failed[-1]  # stopped during the backoff: no further try, the last failure stands
        payload = body() if callable(body) else body
        try:
            if timeout is None and not interruptible:
                return client.post(path, payload)
            return client.post(path, payload, timeout=timeout, interruptible=interruptible)
        except Exception as exc:
            failed[:] = [exc]
            raise

    try:
        return retrying(post)
    except ApiError as exc:
        verdict = classify(exc)
        if verdict is not None:
            raise verdict from exc
        raise
