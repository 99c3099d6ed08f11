"""Shutdown calls whose first answer was lost: retried, they still end in a clean stop."""

import pytest

from agent.calls import Stop
from agent.client import ApiError
from agent.runtime import Agent, Settings
from agent.session import Session, session_call
from agent.state import Credential, StateDir
from protocol import wire


class ScriptedClient:
    """Answers each POST with the next scripted answer (an exception is raised)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.bodies: list[dict] = []

    def post(self, path, body, signed=True):
        self.bodies.append(body)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def agent_with(client, tmp_path) -> Agent:
    agent = Agent(
        client, Credential("http://x", "w", "w", "k"), StateDir(tmp_path), Settings(backoff_max=0.01)
    )
    agent.session = Session("s", 1, version=3, state="draining", heartbeat_interval=10, lease_seconds=30)
    return agent


def test_offline_whose_first_answer_was_lost_is_done(tmp_path):
    lost_then_offline = ScriptedClient(ApiError(409, "session_offline", "the session is offline"))
    agent = agent_with(lost_then_offline, tmp_path)
    assert session_call(agent, wire.SESSION_OFFLINE, done_if=frozenset({"session_offline"})) is None


def test_offline_refused_for_another_reason_still_stops_the_agent(tmp_path):
    superseded = ScriptedClient(ApiError(409, "session_superseded", "replaced"))
    with pytest.raises(Stop) as stop:
        session_call(
            agent_with(superseded, tmp_path), wire.SESSION_OFFLINE, done_if=frozenset({"session_offline"})
        )
    assert stop.value.exit_code == wire.EXIT_FENCED


def test_drain_adopts_the_version_its_lost_answer_produced(tmp_path):
    client = ScriptedClient(
        ApiError(409, "session_version_conflict", "stale", "expectedVersion", {"currentVersion": 4}),
        {"version": 4, "state": "draining"},
    )
    assert session_call(agent_with(client, tmp_path), wire.SESSION_DRAIN) == {
        "version": 4,
        "state": "draining",
    }
    assert [body["expectedVersion"] for body in client.bodies] == [3, 4]
