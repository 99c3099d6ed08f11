"""The heartbeat around a shutdown's drain (agent.runtime, agent.heartbeat): held only while a try
of the drain is in flight, so a drain the control plane keeps answering busy never lets the
session lapse; and a heartbeat being retried when the drain begins sends no further try that
carries the version from before it.

The control plane here is a small in-process model of one session — a lease in wall-clock
seconds extended by each heartbeat, a version moved by the drain and by a heartbeat whose slots
changed, and the real refusal codes (``session_version_conflict`` with ``currentVersion``,
``session_expired``) — behind a client that records every call with its start and end, so that
overlapping session calls are seen. Real threads and real time: the agent's own heartbeat thread
and main loop run as in production.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import agent.runtime as runtime
from agent.client import ApiError, TransportError
from agent.runtime import Agent, Settings
from agent.session import Session
from agent.state import Credential, StateDir
from protocol import wire

SESSION_CALLS = {wire.SESSION_HEARTBEAT, wire.SESSION_DRAIN, wire.SESSION_OFFLINE}


@dataclass
class Call:
    started: float
    ended: float
    path: str
    outcome: str


@dataclass
class ControlPlane:
    """One session as the control plane keeps it; ``trouble[path](body)`` may sleep or raise."""

    lease_seconds: float
    interval: float
    version: int = 0
    state: str = "online"
    slots: int = 1
    expires: float = 0.0
    calls: list[Call] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    trouble: dict[str, Callable[[dict], None]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.expires = time.monotonic() + self.lease_seconds

    def answer(self) -> dict:
        return {
            "workerId": "w",
            "sessionId": "s",
            "generation": 1,
            "version": self.version,
            "state": self.state,
            "maxConcurrentRuns": 1,
            "availableSlots": self.slots,
            "capabilitiesSha256": "0" * 64,
            "leaseExpiresAt": "2026-01-01T00:01:00Z",
            "heartbeatIntervalSeconds": self.interval,
            "nextHeartbeatAt": "2026-01-01T00:00:00.500Z",
            "serverTime": "2026-01-01T00:00:00Z",
            "replacedSession": False,
            "cancelRequested": [],
            "rotationRequired": False,
        }

    def handle(self, path: str, body: dict) -> dict:
        with self.lock:
            if self.state == "offline":
                raise ApiError(409, "session_offline", "the session is offline")
            if time.monotonic() > self.expires:
                raise ApiError(409, "session_expired", "the session lease lapsed")
            if path == wire.CLAIM:
                return {"offers": [], "pollAfterSeconds": 0.2}
            if body["expectedVersion"] != self.version:
                raise ApiError(
                    409,
                    "session_version_conflict",
                    "stale",
                    "expectedVersion",
                    {"currentVersion": self.version},
                )
            if path == wire.SESSION_HEARTBEAT:
                slots = 0 if self.state == "draining" else body["availableSlots"]
                if slots != self.slots:
                    self.slots, self.version = slots, self.version + 1
                self.expires = time.monotonic() + self.lease_seconds
            elif path == wire.SESSION_DRAIN and self.state != "draining":
                self.state, self.slots, self.version = "draining", 0, self.version + 1
            elif path == wire.SESSION_OFFLINE:
                self.state = "offline"
            return self.answer()

    def refused(self) -> list[Call]:
        """The session calls answered with a 4xx (a 503 is retried, a missing answer is not one)."""
        return [call for call in self.calls if call.path in SESSION_CALLS and call.outcome.startswith("4")]


class Client:
    def __init__(self, plane: ControlPlane, timeout: float) -> None:
        self.plane = plane
        self.timeout = timeout

    def post(self, path, body, **kwargs):
        plane, me, started = self.plane, threading.get_ident(), time.monotonic()
        with plane.lock:
            others = {p for thread, p in plane.in_flight.items() if thread != me}
            if path in SESSION_CALLS and others & SESSION_CALLS:
                plane.overlaps.append(f"{path} sent while {sorted(others)} in flight")
            plane.in_flight[me] = path
        outcome = "no answer"
        try:
            if path in plane.trouble:
                plane.trouble[path](body)
            answer = plane.handle(path, body)
            outcome = "200"
            return answer
        except ApiError as exc:
            outcome = f"{exc.status} {exc.code}"
            raise
        finally:
            with plane.lock:
                plane.in_flight.pop(me, None)
                plane.calls.append(Call(started, time.monotonic(), path, outcome))

    def interrupt(self) -> None:
        pass


def run_until_stopped(
    plane: ControlPlane, tmp_path, monkeypatch, *, shutdown_after: float, job_until=None
) -> int:
    """Run a real Agent against ``plane`` and ask it to stop after ``shutdown_after`` seconds; a
    job holds the drain open until ``job_until`` (seconds from now) when given. Its exit code."""
    credential = Credential("http://x", "w", "w", "k")
    agent = Agent(
        Client(plane, timeout=1.0),
        credential,
        StateDir(tmp_path),
        Settings(backoff_max=0.5, long_poll=False, poll_min=0.2, poll_max=0.2, drain_timeout=30),
    )
    monkeypatch.setattr(
        runtime,
        "register",
        lambda agent, capabilities: Session(
            "s", 1, 0, "online", heartbeat_interval=plane.interval, lease_seconds=plane.lease_seconds
        ),
    )
    if job_until is not None:

        class Job:
            cancelling = False

            def abandon(self) -> None:
                pass

            def cancel(self) -> None:
                pass

        agent._runners["a"] = Job()  # type: ignore[assignment]
        threading.Timer(job_until, agent.runner_done, args=("a",)).start()
    threading.Timer(shutdown_after, agent.request_shutdown).start()
    return agent.run({})


def test_a_drain_answered_busy_for_longer_than_the_lease_keeps_the_session_alive(tmp_path, monkeypatch):
    plane = ControlPlane(lease_seconds=2.0, interval=0.5)
    busy_until = time.monotonic() + 1.0 + 4.0  # from the shutdown on, twice the session lease

    def busy(body: dict) -> None:
        if time.monotonic() < busy_until:
            raise ApiError(503, "storage_busy", "the database is busy; retry", retry_after=0)

    plane.trouble[wire.SESSION_DRAIN] = busy
    code = run_until_stopped(plane, tmp_path, monkeypatch, shutdown_after=1.0)
    drains = [call for call in plane.calls if call.path == wire.SESSION_DRAIN]
    beats_between = [
        call
        for call in plane.calls
        if call.path == wire.SESSION_HEARTBEAT and drains[0].started < call.started < drains[-1].started
    ]
    assert code == 0, plane.calls
    assert drains[-1].outcome == "200" and len(drains) > 2, drains
    assert len(beats_between) >= 3, plane.calls  # the lease (2 s) outlived 4 s of refused drains
    assert plane.refused() == [], plane.calls
    assert plane.overlaps == []


def test_a_heartbeat_retried_when_the_drain_begins_sends_no_try_after_it(tmp_path, monkeypatch):
    plane = ControlPlane(lease_seconds=30.0, interval=0.5)
    started = time.monotonic()

    def unreachable_for_a_while(body: dict) -> None:
        if 0.6 < time.monotonic() - started < 3.0:
            time.sleep(0.2)
            raise TransportError("connection reset by peer")

    plane.trouble[wire.SESSION_HEARTBEAT] = unreachable_for_a_while
    # The shutdown comes while heartbeats get no answer, a job keeps the drain open past that.
    code = run_until_stopped(plane, tmp_path, monkeypatch, shutdown_after=1.5, job_until=4.0)
    drain = next(call for call in plane.calls if call.path == wire.SESSION_DRAIN)
    assert code == 0, plane.calls
    assert drain.outcome == "200", plane.calls
    assert plane.refused() == [], plane.calls  # no heartbeat carried the version from before the drain
    assert plane.overlaps == [], plane.overlaps
    # Heartbeats went on once the drain was answered, and none was in flight with the offline call.
    assert any(c.path == wire.SESSION_HEARTBEAT and c.started > drain.ended for c in plane.calls)
