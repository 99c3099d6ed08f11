"""The agent's reactions to error codes come from the catalogue, and the catalogue says what the
agent does: every code the agent treats specially is catalogued with the matching worker action."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agent import calls
from agent.client import ApiError, TransportError
from protocol.errors import ACTION_MEANINGS, CATALOGUE, WorkerAction, codes_with

AGENT = Path(calls.__file__).resolve().parent

#: The sets the agent carried by hand before it derived them from the catalogue.
HAND_COPIED = {
    WorkerAction.RESTART: {
        "session_superseded",
        "session_expired",
        "session_offline",
        "session_unknown",
        "session_generation_mismatch",
        "lease_session_mismatch",
    },
    WorkerAction.STOP: {
        "credential_revoked",
        "credential_expired",
        "credential_unknown",
        "worker_revoked",
        "signature_invalid",
        "signature_path_mismatch",
        "principal_mismatch",
    },
    WorkerAction.ABANDON_ATTEMPT: {
        "lease_expired",
        "lease_released",
        "lease_completed",
        "lease_token_mismatch",
        "lease_unknown",
        "lease_generation_mismatch",
    },
}

#: Codes the agent's code names one by one, and the action that describes what it does on them.
SPELLED_OUT = {
    "session_draining": WorkerAction.WAIT,  # a claim refused: stop claiming, keep the session
    "capacity_exhausted": WorkerAction.WAIT,  # a claim refused: ask again later
    "rate_limited": WorkerAction.RETRY,  # a claim refused: ask again later, quietly
    "session_version_conflict": WorkerAction.ADOPT_VERSION,  # heartbeat/drain/offline
    "lease_version_conflict": WorkerAction.ADOPT_VERSION,  # renew
    "session_offline": WorkerAction.RESTART,  # fenced; the goal of the offline call itself
    # a stopping agent's release of what a claim brought: the lease is gone, nothing to start
    "lease_released": WorkerAction.ABANDON_ATTEMPT,
    # a waiting claim refused for its waitSeconds: an older control plane, short-poll from then on
    "validation_failed": WorkerAction.FIX_REQUEST,
}


def _codes_named_in_agent() -> set[str]:
    """String constants the agent compares an error ``.code`` with, or passes as ``done_if``."""
    found: set[str] = set()

    def strings(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for path in AGENT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Attribute)
                and node.left.attr == "code"
            ):
                for comparator in node.comparators:
                    found |= strings(comparator)
            if isinstance(node, ast.keyword) and node.arg == "done_if":
                found |= strings(node.value)
    return found


@pytest.mark.parametrize("action", sorted(HAND_COPIED))
def test_the_derived_code_sets_equal_the_ones_the_agent_carried_by_hand(action):
    assert codes_with(action) == HAND_COPIED[action]


def test_the_agent_uses_the_derived_sets():
    assert calls.FENCED_CODES == codes_with(WorkerAction.RESTART)
    assert calls.REFUSED_CODES == codes_with(WorkerAction.STOP)
    assert calls.LEASE_LOST_CODES == codes_with(WorkerAction.ABANDON_ATTEMPT)
    assert calls.RETRIED_CODES == codes_with(WorkerAction.RETRY)


def test_retry_means_what_the_agent_retries():
    """The agent retries any 429/503 answer, a stale signature (after realigning its clock), a
    body the server stopped waiting for (408 ``request_timeout``: a slow link, not a wrong call)
    and a fault of the control plane's own (500 ``internal_error``)."""
    retried = {code for code, spec in CATALOGUE.items() if spec.status in (429, 503)} | {
        "signature_stale",
        "request_timeout",
        "internal_error",
    }
    assert codes_with(WorkerAction.RETRY) == retried


def test_every_code_the_agent_names_is_catalogued_with_the_right_action():
    named = _codes_named_in_agent()
    assert named, "the scan found nothing: the test would be vacuous"
    assert named <= set(CATALOGUE), sorted(named - set(CATALOGUE))
    assert named <= set(SPELLED_OUT), f"say which action describes {sorted(named - set(SPELLED_OUT))}"
    for code, action in SPELLED_OUT.items():
        assert CATALOGUE[code].action is action, code


def test_every_action_is_documented_and_used():
    assert set(ACTION_MEANINGS) == set(WorkerAction)
    assert {spec.action for spec in CATALOGUE.values()} == set(WorkerAction)


def test_a_fault_of_the_control_plane_is_retried_as_an_unanswered_call_was():
    """``internal_error`` (a JSON 500, ``api.exceptions.server_error``) is retried, as the HTML
    500 it replaced was (a ``TransportError``): every worker call is replay-safe."""
    assert calls.transient(TransportError("HTTP 500 with a non-JSON body"))
    assert calls.transient(ApiError(500, "internal_error", CATALOGUE["internal_error"].meaning))
    assert calls.classify(ApiError(500, "internal_error", "")) is None  # the session carries on
