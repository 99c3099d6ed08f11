"""Worker management through the operator API alone, against a real ``manage.py serve`` and a
real agent process (issue 11 acceptance): create a worker, issue an enrollment token, the agent
enrolls and registers, list and detail show it live, drain, undrain, force a rotation (which the
running agent carries out), revoke (the agent exits 4) — each act audited with the user and role.
And an agent below the configured minimum version is refused at registration with
``agent_version_unsupported`` and exits 6, not restarted; the admin shows it outdated."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from audit.models import Event
from tests.agent.processes import Agent, ControlPlane, wait_for
from tests.helpers import api_token, operator_user
from workers.models import WorkerCredential, WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUN_ARGS = ("run", "--poll-max", "1", "--backoff-max", "1", "--timeout", "5", "--drain-timeout", "10")


class Ops:
    """The operator API over HTTP with an API token."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + "/api/v1/ops/" + path,
            data=data,
            method=method,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())


@pytest.fixture
def plane(tmp_path):
    control_plane = ControlPlane(
        tmp_path,
        QINGLONG_HEARTBEAT_INTERVAL_SECONDS="1",
        QINGLONG_SESSION_LEASE_SECONDS="20",
        QINGLONG_ROTATION_GRACE_SECONDS="60",
    )
    control_plane.start()
    yield control_plane
    control_plane.stop()


def _enroll(plane, ops, tmp_path, name: str) -> tuple[str, Agent]:
    status, worker = ops.call("POST", "workers", {"name": name})
    assert status == 201, worker
    status, issued = ops.call("POST", f"workers/{worker['id']}/enrollment-tokens", {})
    assert status == 201 and issued["token"].startswith("qlenroll_"), issued
    agent = Agent(tmp_path / "state", tmp_path)
    assert agent.start("enroll", "--server", plane.url, "--token", issued["token"]).wait(30) == 0, agent.log()
    return worker["id"], agent


def test_worker_management_through_the_api_alone(plane, tmp_path):
    user = operator_user("fleet-admin", role="admin")
    ops = Ops(plane.url, api_token(user, role="admin"))
    worker_id, agent = _enroll(plane, ops, tmp_path, "api-box")
    try:
        agent.start(*RUN_ARGS)
        live = wait_for(
            lambda: ops.call("GET", f"workers/{worker_id}")[1].get("liveSession") or None,
            what="the worker live in the API",
        )
        assert (live["generation"], live["state"], live["versionPolicy"]) == (1, "online", "current")
        assert live["capacityUsed"] == 0 and live["maxConcurrentRuns"] >= 1
        assert live["heartbeatAgeSeconds"] < 20 and live["capabilities"]["os"] == "linux"
        assert live["softwareVersion"].startswith("qinglong-worker/") and live["protocolVersion"] == 1
        listed = ops.call("GET", "workers?state=active")[1]
        assert [w["name"] for w in listed["results"]] == ["api-box"] and listed["next"] is None

        status, drained = ops.call("POST", f"workers/{worker_id}/drain", {})
        assert (status, drained["state"], drained["liveSession"]["state"]) == (200, "draining", "draining")
        status, undrained = ops.call("POST", f"workers/{worker_id}/undrain")
        assert (status, undrained["state"], undrained["liveSession"]["state"]) == (200, "active", "online")

        first_key = WorkerCredential.objects.get(worker_id=worker_id, state="active").pk
        status, rotating = ops.call("POST", f"workers/{worker_id}/rotate", {})
        assert status == 200 and rotating["rotationRequired"] is True
        wait_for(
            lambda: (
                WorkerCredential.objects.filter(worker_id=worker_id, state="active")
                .exclude(pk=first_key)
                .exists()
            ),
            what="the agent to rotate its key",
        )
        assert ops.call("GET", f"workers/{worker_id}")[1]["rotationRequired"] is False

        status, revoked = ops.call("POST", f"workers/{worker_id}/revoke", {})
        assert (status, revoked["state"], revoked["liveSession"]) == (200, "revoked", None)
        assert agent.process.wait(30) == 4, agent.log()
    finally:
        agent.kill()

    acts = list(
        Event.objects.filter(worker_id=worker_id, actor="fleet-admin")
        .order_by("id")
        .values_list("kind", "data")
    )
    assert [kind for kind, _ in acts] == [
        "worker.created",
        "enrollment.token_issued",
        "session.drained",
        "worker.drained",
        "session.undrained",
        "worker.undrained",
        "credential.rotation_forced",
        "session.fenced",
        "worker.revoked",
    ]
    assert all(
        data.get("role") == "admin"
        for kind, data in acts
        if kind.startswith(("worker.", "credential.", "enrollment."))
    )
    audit = ops.call("GET", f"audit?worker={worker_id}&actor=fleet-admin&action=worker.")[1]["results"]
    assert [e["kind"] for e in audit] == [
        "worker.revoked",
        "worker.undrained",
        "worker.drained",
        "worker.created",
    ]


def test_an_agent_below_the_minimum_version_is_refused_and_exits_6(tmp_path):
    plane = ControlPlane(tmp_path, QINGLONG_MIN_AGENT_VERSION="99.0.0")
    plane.start()
    try:
        ops = Ops(plane.url, api_token(operator_user("fleet-admin", role="admin"), role="admin"))
        worker_id, agent = _enroll(plane, ops, tmp_path, "old-box")
        try:
            assert agent.start(*RUN_ARGS).wait(60) == 6, agent.log()
            assert "agent_version_unsupported" in agent.log() and "do not restart" in agent.log()
        finally:
            agent.kill()
    finally:
        plane.stop()
    assert not WorkerSession.objects.filter(worker_id=worker_id).exists()
    refused = Event.objects.get(worker_id=worker_id, kind="session.version_refused")
    assert refused.data["count"] == 1 and refused.data["status"] == "outdated"
