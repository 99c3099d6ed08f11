"""The agent's transport rules without a server: which answers stop it with which status, how it
backs off, how it rotates its key. No Django here (the agent imports none)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tenacity import RetryCallState, Retrying

from agent.calls import FENCED_CODES, MAX_RETRY_AFTER, REFUSED_CODES, Stop, backoff, classify
from agent.client import ApiError, TransportError
from agent.rotation import rotate_key
from agent.runtime import Agent, Settings
from agent.session import Session
from agent.state import Credential, StateDir
from protocol import wire
from protocol.signer import WorkerKey


class FakeClient:
    """Answers from a script: each item is a dict (the answer) or an exception to raise."""

    def __init__(self, script, key_id: str = "wkc_old") -> None:
        self.script = list(script)
        self.calls: list[tuple[str, dict]] = []
        self.key_id = key_id

    def post(self, path, body):
        self.calls.append((path, body))
        outcome = self.script.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def with_key(self, key_id, key):
        clone = FakeClient(self.script, key_id)
        clone.calls = self.calls
        return clone


def make_agent(tmp_path: Path, script, **settings) -> Agent:
    state = StateDir(tmp_path / "state")
    credential = Credential("http://127.0.0.1:8600", "0190", "edge", "wkc_old")
    state.save(credential, WorkerKey.generate())
    return Agent(FakeClient(script), credential, state, Settings(backoff_max=0.01, **settings))


@pytest.mark.parametrize("code", sorted(FENCED_CODES))
def test_a_fenced_session_stops_the_agent_with_status_3(code):
    stop = classify(ApiError(409, code, "fenced"))
    assert stop.exit_code == wire.EXIT_FENCED == 3
    assert "supervisor starts a fresh process" in stop.reason and code in stop.reason


@pytest.mark.parametrize("code", sorted(REFUSED_CODES))
def test_a_refused_credential_stops_the_agent_with_status_4_and_says_what_to_do(code):
    stop = classify(ApiError(401, code, "refused"))
    assert stop.exit_code == wire.EXIT_CREDENTIAL_REFUSED == 4
    assert "re-enrolled" in stop.reason and "do not restart" in stop.reason


@pytest.mark.parametrize("code", ["lease_expired", "validation_failed", "signature_replayed", "rate_limited"])
def test_other_refusals_are_local_to_one_call(code):
    assert classify(ApiError(400, code, "x")) is None


def test_a_revoked_credential_is_never_retried(tmp_path):
    agent = make_agent(tmp_path, [ApiError(401, "credential_revoked", "the credential was revoked")])
    with pytest.raises(Stop) as stopped:
        agent.call(wire.SESSION_HEARTBEAT, {}, patience=None)
    assert stopped.value.exit_code == 4
    assert len(agent.client.calls) == 1


def test_transport_errors_and_503_are_retried_until_an_answer(tmp_path):
    agent = make_agent(
        tmp_path,
        [
            TransportError("connection refused"),
            ApiError(503, "storage_busy", "busy"),
            ApiError(503, "lock_timeout", "a row lock was not granted in time"),
            {"ok": True},
        ],
    )
    assert agent.call(wire.SESSION_HEARTBEAT, {}) == {"ok": True}
    assert len(agent.client.calls) == 4


def test_patience_bounds_the_retries(tmp_path):
    agent = make_agent(tmp_path, [TransportError("down")] * 1000)
    started = time.monotonic()
    with pytest.raises(TransportError):
        agent.call(wire.LEASE_RENEW, {}, patience=0.2)
    assert time.monotonic() - started < 1.0


def _state_after(exc: BaseException, attempt: int = 1) -> RetryCallState:
    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return state


def test_backoff_is_jittered_capped_and_honours_retry_after():
    wait = backoff(2.0)
    delays = [wait(_state_after(TransportError("x"), attempt=10)) for _ in range(200)]
    assert all(0 <= d <= 2.0 for d in delays) and len({round(d, 3) for d in delays}) > 50  # full jitter
    assert wait(_state_after(ApiError(429, "rate_limited", "slow down", retry_after=7))) >= 7
    assert (
        wait(_state_after(ApiError(429, "rate_limited", "slow down", retry_after=10_000))) == MAX_RETRY_AFTER
    )


def test_rotation_saves_the_new_key_before_switching_to_it(tmp_path):
    agent = make_agent(
        tmp_path, [{"credentialId": "wkc_new", "previousCredentialValidUntil": "2030-01-01T00:00Z"}]
    )
    assert rotate_key(agent) == "wkc_new"
    path, body = agent.client.calls[0]
    assert path == wire.ROTATE_KEY and len(body["publicKey"]) == 43
    stored = json.loads((tmp_path / "state" / "credential.json").read_text())
    assert stored["credentialId"] == "wkc_new"
    assert [p.name for p in (tmp_path / "state").glob("key-*.pem")] == ["key-wkc_new.pem"]
    assert agent.client.key_id == "wkc_new"
    credential, key = agent.state.load()
    assert key.public_key_text() == body["publicKey"]


def test_a_failed_rotation_keeps_the_old_key_and_the_agent_running(tmp_path):
    heartbeat = {
        "version": 0,
        "state": "online",
        "cancelRequested": [],
        "rotationRequired": True,
        "nextHeartbeatAt": "2030-01-01T00:00:10Z",
        "serverTime": "2030-01-01T00:00:00Z",
    }
    agent = make_agent(
        tmp_path, [heartbeat, ApiError(409, "credential_superseded", "a newer credential exists")]
    )
    agent.session = Session("s", 1, 0, "online", 10.0, 30.0)
    assert agent.heartbeat.step() == 10.0
    assert agent.credential.credentialId == "wkc_old"
    assert agent.state.load()[0].credentialId == "wkc_old"


def test_a_rotation_refused_for_the_credential_stops_the_agent(tmp_path):
    heartbeat = {
        "version": 0,
        "state": "online",
        "cancelRequested": [],
        "rotationRequired": True,
        "nextHeartbeatAt": "2030-01-01T00:00:10Z",
        "serverTime": "2030-01-01T00:00:00Z",
    }
    agent = make_agent(tmp_path, [heartbeat, ApiError(401, "credential_expired", "grace over")])
    agent.session = Session("s", 1, 0, "online", 10.0, 30.0)
    with pytest.raises(Stop) as stopped:  # Heartbeat._loop turns this into agent.fail(stop)
        agent.heartbeat.step()
    assert stopped.value.exit_code == 4
