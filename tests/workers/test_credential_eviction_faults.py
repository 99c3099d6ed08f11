"""A credential change whose eviction from the shared cache fails, and a rolling deploy's two copy
formats (``workers.principals.forget_credentials``; docs/transport.md, credentials cache).

* Redis is gone when a forced rotation commits: the change still answers (it committed), and no
  replica authenticates the rotated-out key once Redis is back with what it held — a private
  Redis with an append-only file, killed with SIGKILL and started again from that file, so the
  stale copy and its version are really there when it returns.
* The same from the command line (``manage.py worker_admin rotate``, a process that exits): it
  does not exit before Redis is back and the eviction made, or every copy has expired.
* The release before ``-v2`` keys read ``worker-credential:<epoch>:<keyid>`` as a bare
  credential: this release writes nothing there (a replica of the previous release would fail on
  a pair), and a change evicts it too (such a replica must not keep a changed credential).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from django.core.cache import cache

from actions.credentials import credential_force_rotation
from actions.workers import worker_revoke
from protocol import wire
from tests.agent.processes import ROOT, database_url, free_port, wait_for
from tests.helpers import SignedClient, enrolled_worker, register
from tests.workers.test_auth_local_layer_review import _cluster_cache, _forget_keys
from workers import principals
from workers.models import CredentialState, WorkerCredential

pytestmark = [pytest.mark.django_db(transaction=True)]


def _start_redis(port: int, directory) -> subprocess.Popen:
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", ""]
        + ["--appendonly", "yes", "--appendfsync", "always"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_connect_timeout=1)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    wait_for(answers, timeout=10, what="the private Redis")
    return server


def _cached_then_redis_killed(client, settings, protocol_settings, url: str, server: subprocess.Popen):
    """An enrolled worker whose credential the private Redis at ``url`` holds a copy of (one
    signed heartbeat), then that Redis killed: (worker, its signed client, the heartbeat body)."""
    _cluster_cache(settings, url)
    protocol_settings(ROTATION_GRACE_SECONDS=0)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 1}
    assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200  # its copy is in Redis now
    server.send_signal(signal.SIGKILL)
    server.wait(10)
    return worker, api, body


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_a_rotation_committed_while_redis_was_down_is_refused_once_it_is_back(
    client, settings, protocol_settings, tmp_path
):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = _start_redis(port, tmp_path)
    try:
        worker, api, body = _cached_then_redis_killed(client, settings, protocol_settings, url, server)

        credential_force_rotation(worker_id=worker.worker_id)  # commits; the eviction cannot reach Redis

        # The eviction thread retries every EVICTION_RETRY_SECONDS and would evict the stale copy
        # as soon as Redis answers, before it is looked at: it waits on the lock meanwhile (a try
        # already past the lock fails on the dead Redis within the pause).
        with principals._PENDING_LOCK:
            time.sleep(2 * principals.EVICTION_RETRY_SECONDS)
            server = _start_redis(port, tmp_path)  # back with the stale copy and its version
            copy = cache.get(principals._credential_key(worker.credential_id))
        assert copy is not None and copy[0].state == "active", copy  # what the eviction missed
        this = api.post(wire.SESSION_HEARTBEAT, body)
        assert (this.status_code, this.json()["code"]) == (401, "credential_expired"), this.json()
        wait_for(lambda: not principals._PENDING_EVICTIONS, timeout=10, what="the deferred eviction")
        principals._LOCAL_CREDENTIALS.clear()  # another replica: nothing of its own in memory
        another = api.post(wire.SESSION_HEARTBEAT, body)
        assert (another.status_code, another.json()["code"]) == (401, "credential_expired"), another.json()
    finally:
        principals._PENDING_EVICTIONS.clear()
        principals._LOCAL_CREDENTIALS.clear()
        server.kill()
        server.wait(10)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_a_rotation_from_the_command_line_while_redis_is_down_waits_to_evict_it(
    client, settings, protocol_settings, tmp_path
):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = _start_redis(port, tmp_path)
    command = None
    try:
        worker, api, body = _cached_then_redis_killed(client, settings, protocol_settings, url, server)
        command = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "worker_admin", "rotate", worker.name],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "DATABASE_URL": database_url(),
                "QINGLONG_SHARED_CACHE": "true",
                "REDIS_URL": url,
                "QINGLONG_ROTATION_GRACE_SECONDS": "0",
            },
        )
        waiting = ""
        for line in command.stderr:  # its log: the eviction failed, and it waits for Redis
            if "waiting for the shared cache to evict" in line:
                waiting = line
                break
        assert waiting, command.communicate(timeout=60)
        rotated = WorkerCredential.objects.get(pk=worker.credential_id)
        assert rotated.state == CredentialState.ROTATED  # committed while Redis was down
        assert command.poll() is None  # and not exited before the eviction
        server = _start_redis(port, tmp_path)  # back with the stale copy and its version
        out, err = command.communicate(timeout=60)
        assert command.returncode == 0, err
        principals._LOCAL_CREDENTIALS.clear()  # a replica with nothing of its own in memory
        answer = api.post(wire.SESSION_HEARTBEAT, body)
        assert (answer.status_code, answer.json()["code"]) == (401, "credential_expired"), answer.json()
    finally:
        if command is not None and command.poll() is None:
            command.kill()
        principals._LOCAL_CREDENTIALS.clear()
        server.kill()
        server.wait(10)


@pytest.mark.redis
def test_the_previous_releases_key_is_never_written_and_is_evicted_on_a_change(client, settings, redis_url):
    _cluster_cache(settings, redis_url)
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 1}
    previous = principals._PREVIOUS_CREDENTIAL_KEY.format(
        principals._credential_epoch(), worker.credential_id
    )
    try:
        assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200
        assert cache.get(previous) is None  # the pair went under the -v2 key only
        stale = principals._credential_from_database(worker.credential_id)
        cache.set(previous, stale, timeout=30)  # as a replica of the previous release caches it
        worker_revoke(worker_id=worker.worker_id)
        assert cache.get(previous) is None
    finally:
        _forget_keys(redis_url, worker.credential_id, session.session_id)
        principals._LOCAL_CREDENTIALS.clear()


# --- the bookkeeping of deferred evictions, with Redis's refusals played by the eviction itself ----


@pytest.fixture
def deferring(monkeypatch):
    """A shared cache whose eviction this test plays; the process's exit never waits for it."""
    monkeypatch.setattr(principals, "cache_is_shared", lambda: True)
    monkeypatch.setattr(principals, "_EVICTION_RETRIES", lambda evict, ids: evict(ids))  # one try
    monkeypatch.setattr(principals, "_waits_at_exit", True)
    principals._PENDING_EVICTIONS.clear()
    yield
    principals._PENDING_EVICTIONS.clear()
    wait_for(lambda: principals._evicter is None, timeout=10, what="the eviction thread's end")


def _refused(ids: list[str]) -> None:
    raise redis.ConnectionError("Connection refused")


@pytest.mark.django_db
def test_a_change_deferred_again_while_a_flush_runs_stays_pending(deferring, monkeypatch):
    """A second change of the credential, refused by Redis after a flush's writes for the first:
    that flush must not take the second one's deferral with it."""
    written, resume = threading.Event(), threading.Event()

    def evict(ids: list[str]) -> None:
        if threading.current_thread().name != "flush":
            _refused(ids)
        written.set()  # the first change's eviction is made…
        resume.wait(10)  # …and the flush is descheduled before it clears its entries

    monkeypatch.setattr(principals, "_evict_shared", evict)
    principals._PENDING_EVICTIONS["key"] = (time.monotonic() + 60, -1)  # the first change's
    flush = threading.Thread(target=principals.flush_pending_evictions, name="flush")
    flush.start()
    assert written.wait(10)
    principals.forget_credentials(["key"])  # the second change commits; Redis refuses it
    resume.set()
    flush.join(10)
    assert "key" in principals._PENDING_EVICTIONS


@pytest.mark.django_db
def test_no_thread_for_the_evictions_is_not_a_failed_change(deferring, monkeypatch):
    monkeypatch.setattr(principals, "_evict_shared", _refused)
    start = threading.Thread.start

    def no_thread(thread: threading.Thread) -> None:
        if thread.name == "credential-evictions":
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    principals.forget_credentials(["first"])  # committed already: never raises
    assert principals._evicter is None and "first" in principals._PENDING_EVICTIONS
    monkeypatch.setattr(threading.Thread, "start", start)  # threads to be had again
    principals.forget_credentials(["second"])
    assert principals._evicter is not None and principals._evicter.is_alive()
    assert {"first", "second"} <= set(principals._PENDING_EVICTIONS)
