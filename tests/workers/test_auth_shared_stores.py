"""The stores behind authentication are shared the way each profile needs (ADR-0012 §1, §6).

Cluster profile: nonces and rate-limit counters live in Redis, so separate control-plane
processes (replicas) see one nonce once and count into one window. Standalone profile: the
operator's ``manage.py`` commands run in another process than the server, and a revocation made
there is refused by the server on its very next request, warm cache or not.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time

import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import strictjson, wire
from protocol.signing import sign_request
from tests.agent.processes import ROOT, manage
from tests.helpers import SignedClient, enrolled_worker, register
from workers import principals

REPLICA = """
import json, os, sys, time
import django
django.setup()
from django.test import RequestFactory
from protocol.errors import ProtocolError
from api.ratelimit import enforce
from core.errors import DomainError
from api.auth import nonce_accept
from workers.principals import cache_is_shared

assert cache_is_shared(), "the cluster profile must use a shared cache"
go, key_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
while not os.path.exists(go):
    time.sleep(0.005)
accepted = []
for index in range(count):
    try:
        nonce_accept(key_id=key_id, nonce=f"nonce-{index:05d}-abcdefghijklmnop",
                     window_seconds=60)
        accepted.append(index)
    except ProtocolError as exc:
        assert exc.code == "signature_replayed", exc.code
allowed = 0
request = RequestFactory().post("/")
for _ in range(count):
    try:
        enforce(request, group="replicas-" + key_id, key=lambda group, req: "one-worker", rate=f"{count}/d",
                message="limited")
        allowed += 1
    except DomainError as exc:
        assert exc.code == "rate_limited", exc.code
print(json.dumps({"accepted": accepted, "allowed": allowed}))
"""


@pytest.mark.redis
def test_two_cluster_replicas_see_each_nonce_once_and_share_rate_limits(redis_url, tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "qinglong.settings",
        "QINGLONG_PROFILE": "cluster-control",
        "REDIS_URL": redis_url,
        "DJANGO_SECRET_KEY": "replica-test-key",
        "DATABASE_URL": "postgres://unused@127.0.0.1:5432/never-connected",
    }
    go, key_id, count = tmp_path / "go", f"wkc_{secrets.token_hex(8)}", 200
    replicas = [
        subprocess.Popen(
            [sys.executable, "-c", REPLICA, str(go), key_id, str(count)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(1.0)  # both replicas import Django and wait for the go file
    go.touch()
    results = []
    for replica in replicas:
        out, err = replica.communicate(timeout=60)
        assert replica.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    first, second = (set(r["accepted"]) for r in results)
    assert first | second == set(range(count)), "a nonce was refused by both replicas"
    assert not first & second, f"{len(first & second)} nonces were accepted by both replicas"
    assert results[0]["allowed"] + results[1]["allowed"] == count


#: Django's backend (nonce and rate limit as separate commands) and the project's (one Lua round trip).
BACKENDS = ["django.core.cache.backends.redis.RedisCache", "core.cache.RedisCache"]


@pytest.mark.redis
@pytest.mark.django_db
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replay_is_refused_over_http_with_the_redis_store(client, settings, redis_url, backend):
    prefix = f"qltest{secrets.token_hex(4)}"
    settings.CACHES = {
        "default": {
            "BACKEND": backend,
            "LOCATION": redis_url,
            "KEY_PREFIX": prefix,
        }
    }
    try:
        worker = enrolled_worker()
        session = register(worker)
        raw = strictjson.dumps({**session.fence(), "expectedVersion": session.version, "availableSlots": 2})
        headers = sign_request(
            method="POST",
            path=wire.SESSION_HEARTBEAT,
            body=raw,
            key_id=worker.credential_id,
            private_key=worker.key,
        )

        def send():
            return client.generic(
                "POST", wire.SESSION_HEARTBEAT, raw, content_type="application/json", headers=headers
            )

        assert send().status_code == 200
        replay = send()
        assert (replay.status_code, replay.json()["code"]) == (401, "signature_replayed")
    finally:  # only this test's keys: never flush a Redis database others may use
        server = redis.Redis.from_url(redis_url)
        for key in server.scan_iter(match=f"{prefix}:*"):
            server.delete(key)


@pytest.mark.django_db(transaction=True)
def test_a_revocation_from_the_command_line_reaches_the_server_process_at_once(client):
    """Here the test process plays ``manage.py serve`` (warm per-process cache) and the revocation
    runs as ``manage.py worker_admin revoke`` in its own process."""
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200  # the credential is now cached here
    done = manage("worker_admin", "revoke", worker.name)
    assert done.returncode == 0, done.stderr
    answer = api.post(wire.SESSION_HEARTBEAT, body)
    assert (answer.status_code, answer.json()["code"]) == (401, "credential_revoked")


@pytest.mark.redis
@pytest.mark.django_db
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_worker_limit_counts_fresh_signed_requests_only(
    client, settings, redis_url, backend, protocol_settings
):
    """The limit is the same on both backends: three fresh requests pass, the fourth is 429 with a
    Retry-After, and a replay is refused without being counted."""
    protocol_settings(RATE_WORKER="3/h")
    prefix = f"qltest{secrets.token_hex(4)}"
    settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": redis_url, "KEY_PREFIX": prefix}}
    try:
        worker = enrolled_worker()
        session = register(worker)
        api = SignedClient(client, worker)
        body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
        raw = strictjson.dumps(body)
        headers = sign_request(
            method="POST",
            path=wire.SESSION_HEARTBEAT,
            body=raw,
            key_id=worker.credential_id,
            private_key=worker.key,
        )

        def send_signed():
            return client.generic(
                "POST", wire.SESSION_HEARTBEAT, raw, content_type="application/json", headers=headers
            )

        assert send_signed().status_code == 200
        replay = send_signed()
        assert (replay.status_code, replay.json()["code"]) == (401, "signature_replayed")
        assert [api.post(wire.SESSION_HEARTBEAT, body).status_code for _ in range(2)] == [200, 200]
        limited = api.post(wire.SESSION_HEARTBEAT, body)
        assert (limited.status_code, limited.json()["code"]) == (429, "rate_limited")
        assert int(limited["Retry-After"]) >= 1
    finally:  # only this test's keys: never flush a Redis database others may use
        server = redis.Redis.from_url(redis_url)
        for key in server.scan_iter(match=f"{prefix}:*"):
            server.delete(key)


def _cluster_cache(settings, redis_url: str) -> None:
    """The cluster profile's cache as ``QINGLONG_SHARED_CACHE=1`` configures it for another process."""
    settings.CACHES = {
        "default": {"BACKEND": "core.cache.RedisCache", "LOCATION": redis_url, "KEY_PREFIX": "ql"}
    }


def _forget_keys(redis_url: str, *ids: object) -> None:
    """Only this test's keys (they all name its credential or session): never flush a shared Redis."""
    server = redis.Redis.from_url(redis_url)
    for value in ids:
        for key in server.scan_iter(match=f"ql:*{value}*"):
            server.delete(key)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("action", "env", "code"),
    [
        ("revoke", {}, "credential_revoked"),
        # a forced rotation with no grace: the copy in memory still says "active"
        ("rotate", {"QINGLONG_ROTATION_GRACE_SECONDS": "0"}, "credential_expired"),
    ],
)
def test_a_credential_change_on_another_replica_reaches_this_replicas_memory_on_the_next_request(
    client, settings, redis_url, action, env, code
):
    """This process is one cluster replica with the credential and session owner in memory
    (``workers.principals``); the change runs in another process against the same Redis."""
    _cluster_cache(settings, redis_url)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    try:
        for _ in range(2):
            assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200
        held = [key for key in principals._LOCAL_CREDENTIALS if key.endswith(worker.credential_id)]
        assert held, "the credential must be held in this process's memory"
        done = manage(
            "worker_admin",
            action,
            worker.name,
            env={"QINGLONG_SHARED_CACHE": "1", "REDIS_URL": redis_url, **env},
        )
        assert done.returncode == 0, done.stderr
        assert held[0] in principals._LOCAL_CREDENTIALS  # still the stale copy: only Redis changed
        forged = api.post(wire.SESSION_HEARTBEAT, body, key=Ed25519PrivateKey.generate())
        assert (forged.status_code, forged.json()["code"]) == (401, code)  # what the shared stores say
        answer = api.post(wire.SESSION_HEARTBEAT, body)
        assert (answer.status_code, answer.json()["code"]) == (401, code)
        assert held[0] not in principals._LOCAL_CREDENTIALS
        again = api.post(wire.SESSION_HEARTBEAT, body)
        assert (again.status_code, again.json()["code"]) == (401, code)
    finally:
        _forget_keys(redis_url, worker.credential_id, session.session_id)


@pytest.mark.redis
@pytest.mark.django_db
def test_a_warm_replica_authenticates_and_binds_from_memory(client, settings, redis_url, monkeypatch):
    """With the credential and the session owner in memory, the only Redis command of a signed
    request is the nonce round trip (which also reads the credential's version)."""
    _cluster_cache(settings, redis_url)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    try:
        assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200
        commands: list[str] = []
        execute = redis.Redis.execute_command

        def counted(self, *args, **kwargs):
            commands.append(str(args[0]))
            return execute(self, *args, **kwargs)

        monkeypatch.setattr(redis.Redis, "execute_command", counted)
        assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200
        assert commands == ["EVALSHA"]
    finally:
        _forget_keys(redis_url, worker.credential_id, session.session_id)
