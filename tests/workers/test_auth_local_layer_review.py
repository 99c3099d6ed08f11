"""Review of issue 13 point 3 (both fixed since: a copy is trusted only with a version it read or
created, and a change deletes the shared copy before writing the new version): the credential
kept in a replica's memory (``workers.principals``, cluster profile) outlived a revocation when
its version key in Redis did not say the credential moved.

The in-process copy is trusted while the version read in the nonce round trip equals the one it
was read with. Two ways the two agree although the credential was revoked:

* the version key is gone from Redis (evicted under ``maxmemory``, a Redis restart without
  persistence, or simply never written / expired for a credential enrolled minutes ago) — the
  copy was read with "no version" and Redis again answers "no version";
* a replica reads the credential between the two Redis commands of ``forget_credentials``
  (``set_many`` of the new version, then ``delete_many`` of the credential): it gets the *old*
  credential with the *new* version and keeps it as current.

Without the in-process layer both requests are refused (the credential key is gone, the
database says revoked): ADR-0012 §1 "a revoked credential fails on the next request".
"""

from __future__ import annotations

import threading

import pytest
import redis
from django.core.cache import cache
from django.db import connection

from actions.credentials import credential_force_rotation
from actions.workers import worker_revoke
from protocol import wire
from tests.agent.processes import manage
from tests.helpers import SignedClient, enrolled_worker, register
from workers import principals


def _cluster_cache(settings, redis_url: str) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "core.cache.RedisCache", "LOCATION": redis_url, "KEY_PREFIX": "ql"}
    }


def _forget_keys(redis_url: str, *ids: object) -> None:
    """Only this test's keys (they all name its credential or session): never flush a shared Redis."""
    server = redis.Redis.from_url(redis_url)
    for value in ids:
        for key in server.scan_iter(match=f"ql:*{value}*"):
            server.delete(key)


def _drop_version_key(redis_url: str, credential_id: str) -> int:
    """What an eviction (or an empty Redis after a restart) does to the credential's version."""
    key = cache.make_key(principals._VERSION_KEY.format(credential_id))
    return redis.Redis.from_url(redis_url).delete(key)


#: (worker_admin action, its environment, the refusal the shared stores give, the in-process action)
CHANGES = [
    ("revoke", {}, "credential_revoked", worker_revoke),
    # a forced rotation with no grace: the copy in memory still says "active"
    ("rotate", {"QINGLONG_ROTATION_GRACE_SECONDS": "0"}, "credential_expired", credential_force_rotation),
]


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("action", "env", "code", "change"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_credential_change_on_another_replica_is_refused_when_the_version_key_was_evicted(
    client, settings, redis_url, action, env, code, change
):
    _cluster_cache(settings, redis_url)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    try:
        # A credential enrolled more than 2 x CREDENTIAL_CACHE_SECONDS + 60 s ago has no version key.
        _drop_version_key(redis_url, worker.credential_id)
        principals._LOCAL_CREDENTIALS.clear()
        for _ in range(2):
            assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200
        assert any(key.endswith(worker.credential_id) for key in principals._LOCAL_CREDENTIALS)
        done = manage(
            "worker_admin",
            action,
            worker.name,
            env={"QINGLONG_SHARED_CACHE": "1", "REDIS_URL": redis_url, **env},
        )
        assert done.returncode == 0, done.stderr
        assert _drop_version_key(redis_url, worker.credential_id) == 1  # the revocation wrote it; evicted
        answer = api.post(wire.SESSION_HEARTBEAT, body)
        # Observed: the changed credential's copy in memory authenticates the request for up to
        # CREDENTIAL_CACHE_SECONDS (30 s) on every replica that held it: after a revocation the
        # heartbeat's own check answers 403 worker_revoked; after a forced rotation it is 200.
        assert (answer.status_code, answer.json().get("code")) == (401, code)
    finally:
        _forget_keys(redis_url, worker.credential_id, session.session_id)
        principals._LOCAL_CREDENTIALS.clear()


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("action", "env", "code", "change"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_credential_read_between_the_new_version_and_the_eviction_is_not_kept_as_current(
    client, settings, redis_url, monkeypatch, protocol_settings, action, env, code, change
):
    """The interleaving is forced at the one point it can happen: a request of this replica runs
    after the revocation wrote the new version and before it deleted the credential key."""
    _cluster_cache(settings, redis_url)
    protocol_settings(ROTATION_GRACE_SECONDS=0)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    try:
        assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200  # the credential is in Redis
        principals._LOCAL_CREDENTIALS.clear()  # this replica holds no copy (expired, or never read)
        in_window: list[int] = []
        delete_many = cache.delete_many

        def delete_after_a_request(keys, *args, **kwargs):
            if not in_window:
                in_window.append(api.post(wire.SESSION_HEARTBEAT, body).status_code)
            return delete_many(keys, *args, **kwargs)

        monkeypatch.setattr(cache, "delete_many", delete_after_a_request)
        change(worker_id=worker.worker_id)
        monkeypatch.undo()
        assert len(in_window) == 1  # it raced the change itself: any answer is fair
        answer = api.post(wire.SESSION_HEARTBEAT, body)
        # Observed: the copy read in the window carries the new version, so every later request
        # matches it for up to CREDENTIAL_CACHE_SECONDS: 403 worker_revoked (the heartbeat's own
        # check) after a revocation, 200 after a forced rotation.
        assert (answer.status_code, answer.json().get("code")) == (401, code)
    finally:
        _forget_keys(redis_url, worker.credential_id, session.session_id)
        principals._LOCAL_CREDENTIALS.clear()


@pytest.mark.redis
@pytest.mark.django_db
def test_a_warm_replica_answers_503_when_redis_is_down_and_accepts_nothing_from_memory(
    client, settings, redis_url
):
    """Held: with the credential and the session owner in memory, a request while Redis is
    unreachable is answered 503 ``cache_unavailable`` (the nonce cannot be checked), not accepted."""
    _cluster_cache(settings, redis_url)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    try:
        assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200
        assert any(key.endswith(worker.credential_id) for key in principals._LOCAL_CREDENTIALS)
        settings.CACHES = {  # the same keys, on a port nothing listens on (Redis down)
            "default": {
                "BACKEND": "core.cache.RedisCache",
                "LOCATION": "redis://127.0.0.1:1/15",
                "KEY_PREFIX": "ql",
                "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
            }
        }
        assert any(key.endswith(worker.credential_id) for key in principals._LOCAL_CREDENTIALS)
        answer = api.post(wire.SESSION_HEARTBEAT, body)
        assert (answer.status_code, answer.json().get("code")) == (503, "cache_unavailable")
    finally:
        _cluster_cache(settings, redis_url)
        _forget_keys(redis_url, worker.credential_id, session.session_id)
        principals._LOCAL_CREDENTIALS.clear()


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("action", "env", "code", "change"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_credential_read_before_a_change_committed_is_not_written_back_as_current(
    client, settings, redis_url, monkeypatch, protocol_settings, action, env, code, change
):
    """A request reads the credential from the database; before it writes its copy to Redis, the
    change commits on another connection (a thread of its own) and moves the version. The copy
    written after that is of the old credential: no later request, on any replica, may take it."""
    _cluster_cache(settings, redis_url)
    protocol_settings(ROTATION_GRACE_SECONDS=0)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    credential_key = cache.make_key(principals._credential_key(worker.credential_id))
    try:
        assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200
        principals._LOCAL_CREDENTIALS.clear()  # this replica holds no copy, and neither does Redis:
        assert redis.Redis.from_url(redis_url).delete(credential_key) == 1  # read from the database
        changed: list[BaseException | None] = []
        cache_set = cache.set

        def set_after_the_change(key, *args, **kwargs):
            if cache.make_key(key) == credential_key and not changed:

                def commit_the_change() -> None:
                    try:
                        change(worker_id=worker.worker_id)
                        changed.append(None)
                    except BaseException as exc:  # reported below, in the test's thread
                        changed.append(exc)
                    finally:
                        connection.close()

                thread = threading.Thread(target=commit_the_change)
                thread.start()
                thread.join(30)
            return cache_set(key, *args, **kwargs)

        monkeypatch.setattr(cache, "set", set_after_the_change)
        api.post(wire.SESSION_HEARTBEAT, body)  # it raced the change itself: any answer is fair
        monkeypatch.undo()
        assert changed == [None]
        principals._LOCAL_CREDENTIALS.clear()  # another replica: it has only Redis and the database
        answer = api.post(wire.SESSION_HEARTBEAT, body)
        # Observed before the copy carried its version: the old credential, written back after
        # the change, was read as current with the new version for up to CREDENTIAL_CACHE_SECONDS
        # on every replica: 403 worker_revoked after a revocation, 200 after a forced rotation.
        assert (answer.status_code, answer.json().get("code")) == (401, code)
        assert (api.post(wire.SESSION_HEARTBEAT, body).json().get("code")) == code  # and this one
    finally:
        _forget_keys(redis_url, worker.credential_id, session.session_id)
        principals._LOCAL_CREDENTIALS.clear()
