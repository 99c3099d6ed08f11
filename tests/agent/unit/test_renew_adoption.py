"""A renewal whose answer was lost: the retry learns the version it produced and renews on."""

import pytest

from agent.attempts import AttemptRunner
from agent.client import ApiError
from agent.runtime import Settings


class StubAgent:
    """Answers renewals like the control plane after a committed renewal whose reply was lost."""

    def __init__(self, server_version: int, *, move: bool = True) -> None:
        self.server_version = server_version
        self.move = move
        self.sent: list[int] = []

    def call(self, path, body, **kwargs):
        self.sent.append(body["leaseVersion"])
        if body["leaseVersion"] != self.server_version:
            raise ApiError(
                409,
                "lease_version_conflict",
                "stale",
                "leaseVersion",
                {"currentVersion": self.server_version},
            )
        if self.move:
            self.server_version += 1
        return {"lease": {"leaseVersion": self.server_version}, "cancelRequested": False}

    session = type("S", (), {"fence": staticmethod(lambda: {"sessionId": "s", "generation": 1})})
    settings = Settings()


def runner(agent, version: int) -> AttemptRunner:
    offer = {
        "execution": {"env": {}},
        "lease": {
            "attemptId": "0190a0a0-0000-7000-8000-000000000001",
            "leaseGeneration": 1,
            "leaseVersion": version,
            "offerId": "o",
            "renewIntervalSeconds": 2,
        },
    }
    return AttemptRunner(agent, offer, "t" * 43)


def test_a_renewal_refused_for_the_version_a_lost_answer_produced_is_adopted():
    agent = StubAgent(server_version=4)  # the lost renewal moved 3 -> 4
    answer = runner(agent, 3)._renew(patience=1)
    assert agent.sent == [3, 4] and answer["lease"]["leaseVersion"] == 5


def test_an_older_current_version_is_not_adopted():
    agent = StubAgent(server_version=2, move=False)
    with pytest.raises(ApiError):
        runner(agent, 3)._renew(patience=1)
    assert agent.sent == [3]
