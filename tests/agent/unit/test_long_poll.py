"""The agent's waiting claims without a server (docs/leases.md "Waiting claims"): what it sends,
what it does with the answer, and its fallback to short polling against an older control plane
(which answers ``claim/wait`` with the API's 404 ``not_found``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from agent.client import ApiError, TransportError
from agent.runtime import Agent, Settings
from agent.session import Session
from agent.state import Credential, StateDir
from protocol import wire
from protocol.signer import WorkerKey


class FakeClient:
    """Answers from a script per path; records each call with its keyword arguments."""

    def __init__(self, script: dict[str, list]) -> None:
        self.script = script
        self.calls: list[tuple[str, dict, dict]] = []
        self.interrupted = 0

    def post(self, path, body, **kwargs):
        self.calls.append((path, body, kwargs))
        outcome = self.script[path].pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def interrupt(self):
        self.interrupted += 1


def session_answer(**changes) -> dict:
    return {
        "workerId": "0190",
        "sessionId": "s-1",
        "generation": 1,
        "version": 3,
        "state": "online",
        "maxConcurrentRuns": 1,
        "availableSlots": 1,
        "capabilitiesSha256": "0" * 64,
        "leaseExpiresAt": "2026-01-01T00:00:30Z",
        "heartbeatIntervalSeconds": 10,
        "nextHeartbeatAt": "2026-01-01T00:00:10Z",
        "serverTime": "2026-01-01T00:00:00Z",
        "replacedSession": False,
        "cancelRequested": [],
        "rotationRequired": False,
        **changes,
    }


def make_agent(tmp_path: Path, script: dict[str, list], **settings) -> tuple[Agent, FakeClient]:
    state = StateDir(tmp_path / "state")
    credential = Credential("http://127.0.0.1:8600", "0190", "edge", "wkc_1")
    state.save(credential, WorkerKey.generate())
    client = FakeClient(script)
    agent = Agent(client, credential, state, Settings(backoff_max=0.01, **settings))  # type: ignore[arg-type]
    agent.session = Session("s-1", 1, 2, "online", heartbeat_interval=10, lease_seconds=30)
    return agent, client


def test_a_waiting_claim_offers_each_free_slot_asks_for_its_wait_and_adopts_the_session(tmp_path):
    answer = {
        "offers": [],
        "cancelRequested": [],
        "waitSeconds": 25.0,
        "ended": "timeout",
        "session": session_answer(version=7),
    }
    agent, client = make_agent(tmp_path, {wire.CLAIM_WAIT: [answer]}, max_concurrent=3, wait_seconds=40)
    assert agent.claims.wait_once() == 0
    path, body, kwargs = client.calls[0]
    assert path == wire.CLAIM_WAIT
    assert len(body["offers"]) == 3 and body["watch"] == [] and body["waitSeconds"] == 40
    assert kwargs["interruptible"] is True and kwargs["timeout"] > 40  # the socket outlasts the wait
    assert agent.claims.granted == 25.0
    assert agent.session.version == 7  # the wait's session answer was adopted like a heartbeat's


def test_an_older_control_plane_gets_short_polls_from_then_on(tmp_path):
    older = ApiError(404, "not_found", "no such endpoint")
    agent, client = make_agent(
        tmp_path, {wire.CLAIM_WAIT: [older], wire.CLAIM: [{"offers": [], "pollAfterSeconds": 1.0}] * 3}
    )
    stop = threading.Timer(2.5, agent.shutdown_requested.set)
    stop.start()
    agent.claims.loop()  # until the timer requests shutdown
    stop.cancel()
    paths = [path for path, _, _ in client.calls]
    assert paths[0] == wire.CLAIM_WAIT
    assert paths[1:] and set(paths[1:]) == {wire.CLAIM}  # never asked to wait again
    assert agent.claims.long_poll is False


def test_with_no_slot_free_the_wait_only_watches_and_a_finished_runner_cuts_it_short(tmp_path):
    agent, client = make_agent(tmp_path, {}, max_concurrent=1)

    class Busy:
        cancelling = False

    agent._runners["a-1"] = Busy()  # type: ignore[assignment]
    answered = threading.Event()

    def post(path, body, **kwargs):
        client.calls.append((path, body, kwargs))
        answered.wait(10)  # held until interrupted
        raise TransportError("interrupted")

    client.post = post  # type: ignore[method-assign]
    client.interrupt = answered.set  # type: ignore[method-assign]
    waiting = threading.Thread(target=agent.claims.wait_once)
    waiting.start()
    while not client.calls:
        threading.Event().wait(0.01)
    body = client.calls[0][1]
    assert body["offers"] == [] and body["watch"] == ["a-1"]
    agent.runner_done("a-1")  # the slot is free: the watch is cut short at once
    waiting.join(5)
    assert not waiting.is_alive()


def test_a_wait_not_answered_brings_the_heartbeat_back_before_the_call_gives_up(tmp_path):
    """Review of issue 18, finding 1: the heartbeat is pushed back past each wait, and the wait's
    call retries through an outage; the first try not answered (refused, timed out, 503) must
    bring the heartbeat back at once — the server holding the wait, and its keep-alive, may be
    gone — not only once the call fails for good."""
    due_at_retry: list[float] = []
    answer = {
        "offers": [],
        "cancelRequested": [],
        "waitSeconds": 25.0,
        "ended": "timeout",
        "session": session_answer(),
    }
    agent, client = make_agent(tmp_path, {wire.CLAIM_WAIT: []}, wait_seconds=30)
    agent.claims.granted = 25.0  # a wait was answered before: this one postpones the heartbeat
    tries = iter([TransportError("connection refused"), ApiError(503, "storage_unavailable", "down"), None])

    def post(path, body, **kwargs):
        client.calls.append((path, body, kwargs))
        outcome = next(tries)
        due_at_retry.append(agent.heartbeat._due - time.monotonic())
        if outcome is not None:
            raise outcome
        return answer

    client.post = post  # type: ignore[method-assign]
    assert agent.claims.wait_once() == 0
    assert len(client.calls) == 3
    assert due_at_retry[0] > 25  # postponed past the wait while the first try was in flight
    assert due_at_retry[1] <= 0 and due_at_retry[2] <= 0  # due at once from the first failed try


def test_a_postponement_made_while_a_heartbeat_is_in_flight_stands(tmp_path):
    """A waiting claim that starts while a heartbeat is in flight postpones the next heartbeat past
    its wait; the heartbeat's own answer (next one in 0.1 s here) must not bring it forward — an
    idle agent sent three needless heartbeats during its first wait after finishing work."""
    agent, _ = make_agent(tmp_path, {})
    agent.session.heartbeat_interval = 0.05
    beat = agent.heartbeat
    steps: list[float] = []
    in_flight, release = threading.Event(), threading.Event()

    def step() -> float:
        steps.append(time.monotonic())
        if len(steps) == 1:
            in_flight.set()
            release.wait(5)
        return 0.1

    beat.step = step  # type: ignore[method-assign]
    beat.start()
    try:
        assert in_flight.wait(5)
        beat.postpone(1.5)  # a wait starts now, while the first heartbeat is in flight
        release.set()
        time.sleep(0.8)  # several of the answer's 0.1 s delays
        assert len(steps) == 1, steps
    finally:
        beat.stop()
