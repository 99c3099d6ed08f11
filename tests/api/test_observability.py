"""Request ids, the access log and JSON logs (api/observability.py; docs/operations.md "Logs").

In-process for the request id rules; a real ``manage.py serve`` with ``QINGLONG_LOG_FORMAT=json``
for "every line parses", and ``make run``'s launcher in JSON mode end to end.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request

import pytest

from agent.client import Client
from protocol import wire
from tests.agent.processes import ROOT, ControlPlane, free_port
from tests.helpers import enrolled_worker, register


@pytest.mark.django_db
def test_a_request_id_is_made_or_kept_and_answered(client, caplog):
    with caplog.at_level(logging.INFO, logger="qinglong.access"):
        made = client.get("/healthz")
        kept = client.get("/healthz", headers={"x-request-id": "edge-42.a_b"})
        forged = client.get("/healthz", headers={"x-request-id": "bad id\nwith newline"})
    assert len(made["X-Request-ID"]) == 32 and kept["X-Request-ID"] == "edge-42.a_b"
    assert forged["X-Request-ID"] != "bad id\nwith newline" and len(forged["X-Request-ID"]) == 32
    lines = [r for r in caplog.records if r.name == "qinglong.access"]
    assert [r.request_id for r in lines] == [made["X-Request-ID"], "edge-42.a_b", forged["X-Request-ID"]]
    assert (lines[1].method, lines[1].path, lines[1].status) == ("GET", "/healthz", 200)


@pytest.mark.django_db
def test_the_access_line_names_the_operator(client, django_user_model):
    operator = django_user_model.objects.create_user("ops-a", password="x", is_staff=True)
    client.force_login(operator)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("qinglong.access").addHandler(handler)
    try:
        client.get("/api/v1/ops/runs")
    finally:
        logging.getLogger("qinglong.access").removeHandler(handler)
    assert [(r.user, r.worker) for r in records] == [("ops-a", "-")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_every_line_the_server_writes_in_json_mode_parses(tmp_path):
    worker = enrolled_worker()
    session = register(worker)
    plane = ControlPlane(tmp_path, QINGLONG_LOG_FORMAT="json")
    try:
        plane.start()
        Client(plane.url, key_id=worker.credential_id, key=worker.key).post(
            wire.SESSION_HEARTBEAT,
            {**session.fence(), "expectedVersion": session.version, "availableSlots": 2},
        )
        for path in ("/healthz", "/readyz", "/api/v1/nowhere", "/api/v1/ops/runs"):
            try:
                urllib.request.urlopen(plane.url + path, timeout=10).read()
            except urllib.error.HTTPError:
                pass
    finally:
        plane.stop()
    lines = [line for line in plane.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # raises on the first line that is not JSON
    access = [r for r in records if r["logger"] == "qinglong.access"]
    heartbeat = next(r for r in access if r["path"] == wire.SESSION_HEARTBEAT)
    assert (
        heartbeat["status"] == 200
        and heartbeat["worker"] == worker.name
        and len(heartbeat["request_id"]) == 32
    )
    assert {r["status"] for r in access if r["path"] == "/api/v1/nowhere"} == {404}
    assert any(r["logger"] == "qinglong.serve" for r in records)


@pytest.mark.slow
@pytest.mark.sqlite  # make run always runs on its own SQLite database: once is enough
def test_make_run_prints_only_json_in_json_mode(tmp_path):
    """``make run ONCE=1`` (scripts/launch.py) with QINGLONG_LOG_FORMAT=json, on its own var dir."""
    env = {
        **os.environ,
        "QINGLONG_VAR_DIR": str(tmp_path / "var"),
        "PORT": str(free_port()),
        "QINGLONG_LOG_FORMAT": "json",
        "ONCE": "1",
    }
    env.pop("DATABASE_URL", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "launch.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 0, "\n".join(lines[-30:])
    not_json = []
    for line in lines:
        try:
            assert isinstance(json.loads(line), dict)
        except (ValueError, AssertionError):
            not_json.append(line)
    assert not not_json, not_json[:5]
    messages = [json.loads(line)["message"] for line in lines]
    assert any("worker drained and went offline cleanly" in message for message in messages)
    # each sample's own output lines, read back from its stored log (issue 14)
    assert any(message.startswith("    sample-shell | hello from ") for message in messages), messages[-40:]
    assert any(message.startswith("    sample-exit-3 | about to fail") for message in messages)
    assert any(
        "sample-python: http://127.0.0.1:" in message and "/admin/runs/run/" in message
        for message in messages
    )
