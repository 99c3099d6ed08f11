"""The agent version policy (issue 11, ``docs/operators.md`` Upgrades): the minimum agent
version and the supported protocol versions refuse a registration with a stable code, are
audited once per window however often the agent retries, and the admin and the API show each
live session's version against the policy."""

from __future__ import annotations

import pytest

from actions.sessions.registration import session_register
from agent.calls import classify
from agent.client import ApiError
from audit.models import Event
from core.errors import DomainError
from protocol import wire
from protocol.ids import uuid7
from tests.helpers import enrolled_worker, operator_headers, operator_user, snapshot
from workers.models import WorkerSession
from workers.versions import version_verdict

pytestmark = pytest.mark.django_db


def _register(worker, software: str, protocol_version: int = 1):
    return session_register(
        worker_id=worker.worker_id,
        session_id=uuid7(),
        capabilities=snapshot(),
        max_concurrent_runs=1,
        available_slots=1,
        software_version=software,
        protocol_version=protocol_version,
    )


@pytest.mark.parametrize(
    ("software", "protocol_version", "status"),
    [
        ("qinglong-worker/0.2.0", 1, "current"),
        ("qinglong-worker/0.3.1", 1, "current"),
        ("qinglong-worker/0.1.9", 1, "outdated"),
        ("qinglong-worker/0.2.0-rc.1", 1, "outdated"),  # a pre-release sorts below its release
        ("qinglong-worker/0.2.0", 2, "outdated"),
        ("something-else/9.9.9", 1, "unknown"),
    ],
)
def test_the_verdict(protocol_settings, software, protocol_version, status):
    protocol_settings(MIN_AGENT_VERSION="0.2.0", SUPPORTED_PROTOCOL_VERSIONS=(1,))
    assert version_verdict(software, protocol_version).status == status


def test_no_minimum_accepts_any_software_but_still_checks_the_protocol(protocol_settings):
    protocol_settings(MIN_AGENT_VERSION="", SUPPORTED_PROTOCOL_VERSIONS=(1,))
    assert version_verdict("test/1", 1).status == "current"
    assert version_verdict("qinglong-worker/0.0.1", 3).status == "outdated"


def test_an_outdated_agent_is_refused_with_the_policy_and_one_audit_row_per_window(protocol_settings):
    protocol_settings(MIN_AGENT_VERSION="0.2.0")
    worker = enrolled_worker()
    for attempt in range(1, 4):
        with pytest.raises(DomainError) as refused:
            _register(worker, "qinglong-worker/0.1.0")
        assert refused.value.code == "agent_version_unsupported" and refused.value.status == 403
        assert refused.value.details == {"minimumAgentVersion": "0.2.0", "supportedProtocolVersions": [1]}
        rows = Event.objects.filter(worker_id=worker.worker_id, kind="session.version_refused")
        assert rows.count() == 1 and rows.get().data == {
            "status": "outdated",
            "protocol": 1,
            "count": attempt,
        }
    assert not WorkerSession.objects.filter(worker_id=worker.worker_id).exists()
    _register(worker, "qinglong-worker/0.2.0")  # the upgraded agent registers
    assert WorkerSession.objects.filter(worker_id=worker.worker_id).count() == 1


def test_the_agent_exits_6_on_the_refusal_and_is_told_not_to_loop():
    stop = classify(ApiError(403, "agent_version_unsupported", "below the minimum"))
    assert stop.exit_code == wire.EXIT_AGENT_OUTDATED == 6
    assert "upgrade" in stop.reason and "do not restart" in stop.reason


def test_admin_and_api_show_a_live_agent_outdated_once_the_minimum_rises(client, protocol_settings):
    worker = enrolled_worker("old-agent")
    _register(worker, "qinglong-worker/0.1.0")
    protocol_settings(MIN_AGENT_VERSION="0.2.0")

    client.force_login(operator_user("watcher", role="viewer"))
    page = client.get("/admin/workers/worker/").content.decode()
    assert "qinglong-worker/0.1.0 (outdated)" in page

    detail = client.get(
        f"/api/v1/ops/workers/{worker.worker_id}", headers=operator_headers("api-watcher", role="viewer")
    )
    assert detail.json()["liveSession"]["versionPolicy"] == "outdated"
