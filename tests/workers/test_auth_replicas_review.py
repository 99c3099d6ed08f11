"""Review of issue 13 point 3 (held): two real cluster replicas (``manage.py serve``, cluster
profile, the same PostgreSQL and Redis), each holding the worker's credential and session owner
in its memory. A nonce used on one is refused on the other; a forced rotation (no grace) made
through the operator API of one is refused on the other's next request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from django.db import connection

from protocol import strictjson, wire
from tests.agent.processes import ControlPlane
from tests.helpers import enrolled_worker, heartbeat, operator_headers, register, signed_headers
from tests.workers.test_auth_local_layer_review import _forget_keys


def _post(url: str, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + path, data=raw, method="POST", headers={**headers, "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_two_warm_replicas_share_nonces_and_a_forced_rotation_on_one_is_refused_on_the_other(
    tmp_path, redis_url
):
    if connection.vendor != "postgresql":
        pytest.skip("the cluster profile runs on PostgreSQL")
    worker = enrolled_worker()
    session = register(worker)
    ops = operator_headers("rev-ops")
    env = {
        "QINGLONG_PROFILE": "cluster-control",
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "DJANGO_SECRET_KEY": "revauth-test-only",
        "QINGLONG_ROTATION_GRACE_SECONDS": "0",
        "QINGLONG_VAR_DIR": str(tmp_path / "var"),
    }
    replicas = [ControlPlane(tmp_path / name, **env) for name in ("a", "b")]
    for replica, name in zip(replicas, ("a", "b"), strict=True):
        (tmp_path / name).mkdir()
        replica.start()
    a, b = replicas
    raw = strictjson.dumps(heartbeat(session))

    def beat(replica: ControlPlane) -> tuple[int, str | None]:
        status, answer = _post(
            replica.url, wire.SESSION_HEARTBEAT, raw, signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
        )
        return status, answer.get("code")

    try:
        for _ in range(2):  # both replicas now hold the credential and the session owner
            assert beat(a) == (200, None) and beat(b) == (200, None)
        once = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
        assert _post(a.url, wire.SESSION_HEARTBEAT, raw, once)[0] == 200
        for replica in (b, a):
            status, answer = _post(replica.url, wire.SESSION_HEARTBEAT, raw, once)
            assert (status, answer.get("code")) == (401, "signature_replayed")
        status, answer = _post(a.url, f"/api/v1/ops/workers/{worker.worker_id}/rotate", b"{}", ops)
        assert status == 200, answer
        assert beat(b) == (401, "credential_expired")
        assert beat(a) == (401, "credential_expired")
    finally:
        for replica in replicas:
            replica.stop()
        _forget_keys(redis_url, worker.credential_id, session.session_id)
