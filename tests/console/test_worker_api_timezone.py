"""The worker API answers in UTC: the console's timezone cookie (``ql_tz``, console/middleware.py)
is an operator's, and a worker request carrying one is not served in that zone."""

from __future__ import annotations

import pytest

from protocol import wire
from tests.helpers import SignedClient, enrolled_worker, heartbeat, register

pytestmark = pytest.mark.django_db


def test_worker_answers_are_in_utc_whatever_timezone_cookie_they_carry(client):
    worker = enrolled_worker()
    session = register(worker)
    client.cookies["ql_tz"] = "Asia/Shanghai"
    answer = SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session))
    assert answer.status_code == 200, answer.content
    assert answer.json()["serverTime"].endswith("Z")
    assert answer.json()["leaseExpiresAt"].endswith("Z")
