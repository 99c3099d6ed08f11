"""A worker whose clock runs fast is realigned with the server's Date, not refused for good."""

from __future__ import annotations

import pytest

from agent.calls import classify
from agent.client import ApiError, Client
from agent.runtime import Agent, Settings
from agent.state import Credential, StateDir
from protocol import wire
from tests.helpers import enrolled_worker, register

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_fast_clock_is_realigned_and_the_call_goes_through(live_server, tmp_path):
    worker = enrolled_worker()
    session = register(worker)
    client = Client(live_server.url, key_id=worker.credential_id, key=worker.key)
    client.clock_offset = 90.0  # as if this machine's clock ran 90 s ahead of the server's
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    with pytest.raises(ApiError) as stale:
        client.post(wire.SESSION_HEARTBEAT, body)
    assert stale.value.code == "signature_stale"
    assert classify(stale.value) is None  # not a refused credential: no exit 4
    assert abs(client.clock_offset) < 3  # learned from the refusal's Date header

    client.clock_offset = 90.0
    credential = Credential(live_server.url, str(worker.worker_id), worker.name, worker.credential_id)
    agent = Agent(client, credential, StateDir(tmp_path), Settings(backoff_max=0.5))
    answer = agent.call(wire.SESSION_HEARTBEAT, body, patience=10)  # retried once, re-signed
    assert answer["sessionId"] == str(session.session_id)


def test_signatures_never_lead_the_server_clock(live_server):
    worker = enrolled_worker()
    session = register(worker)
    client = Client(live_server.url, key_id=worker.credential_id, key=worker.key)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    for _ in range(5):
        client.post(wire.SESSION_HEARTBEAT, body)
        assert client.clock_offset <= 0.0  # Date rounds down and is stamped before we read it
