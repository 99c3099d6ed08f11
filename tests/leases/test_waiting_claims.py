"""Waiting claims (docs/leases.md "Waiting claims"): the keep-alives, the wake-ups sent on commit,
and a waiting claim over HTTP racing a session replacement, a drain and a revocation.

The races are real: the waiting claim is an HTTP request to the live server (its own thread and
database connection), and the fencing act runs on this thread at the same time as work is
enqueued on a third; whatever interleaving happens, the wait must end fenced having claimed
nothing for the old session.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

import psycopg
import pytest
from django.db import close_old_connections, connection
from django.test import AsyncRequestFactory
from rest_framework.renderers import JSONRenderer

from actions.credentials import credential_force_rotation
from actions.runs import run_cancel
from actions.sessions.heartbeat import session_keep_alive, sessions_keep_alive
from actions.workers import worker_drain, worker_revoke
from api import waiting as waiting_hub
from api.leases.waiting import claim_wait
from api.waiting import HUB, MAX_WAITS_PER_SESSION
from core import wakeups
from core.conf import RECEIVED_AT_SCOPE_KEY
from core.db import db_now
from leases.models import RunDispatchLease
from protocol import wire
from protocol.signing import sign_request
from protocol.strictjson import dumps
from qinglong.serving import RequestGuard
from tests.agent.processes import wait_for
from tests.helpers import OfferTicket, enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, running, starting
from workers.models import WorkerSession
from workers.sessions import session_lease_ttl

# --- keep-alives (service level) ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_keep_alive_extends_only_past_half_the_lease_and_never_moves_the_version():
    session = register(enrolled_worker())
    row = WorkerSession.objects.get(pk=session.session_id)
    view = session_keep_alive(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=session.generation
    )
    assert WorkerSession.objects.get(pk=session.session_id).lease_expires_at == row.lease_expires_at
    assert view.session.version == row.version
    # Past half its life: extended to now + TTL, version unchanged.
    WorkerSession.objects.filter(pk=row.pk).update(lease_expires_at=db_now() + timedelta(seconds=5))
    view = session_keep_alive(
        worker_id=session.worker.worker_id, session_id=session.session_id, generation=session.generation
    )
    fresh = WorkerSession.objects.get(pk=session.session_id)
    assert fresh.lease_expires_at - db_now() > timedelta(seconds=20)
    assert fresh.version == row.version == view.session.version


@pytest.mark.django_db
def test_the_waiting_sessions_keep_alive_never_touches_an_ended_or_replaced_session():
    worker = enrolled_worker()
    old = register(worker)
    new = register(worker)  # replaces (fences) the old session
    soon = db_now() + timedelta(seconds=5)
    WorkerSession.objects.filter(pk__in=[old.session_id, new.session_id]).update(lease_expires_at=soon)
    extended = sessions_keep_alive(
        sessions=[(old.session_id, old.generation), (new.session_id, new.generation - 1)], tick=5
    )
    assert extended == 0  # the fenced one, and the live one under a wrong generation
    assert sessions_keep_alive(sessions=[(new.session_id, new.generation)], tick=5) == 1
    assert WorkerSession.objects.get(pk=old.session_id).lease_expires_at == soon
    assert WorkerSession.objects.get(pk=new.session_id).lease_expires_at > soon


@pytest.mark.django_db
def test_the_waiting_sessions_keep_alive_keeps_nearly_a_full_lease_not_just_half():
    """Review of issue 18, finding 1: each hub tick leaves the lease at least TTL − tick long, so
    a control-plane outage begins with almost a whole TTL left (not possibly only half)."""
    session = register(enrolled_worker())
    ttl = session_lease_ttl()
    tick = 5.0
    # Used a little more than one tick of its lease: far from half, yet extended.
    left = ttl - timedelta(seconds=tick * 1.5)
    WorkerSession.objects.filter(pk=session.session_id).update(lease_expires_at=db_now() + left)
    assert sessions_keep_alive(sessions=[(session.session_id, session.generation)], tick=tick) == 1
    assert WorkerSession.objects.get(pk=session.session_id).lease_expires_at - db_now() > ttl - timedelta(
        seconds=1
    )
    # Fresh (less than one tick used): a pure read.
    assert sessions_keep_alive(sessions=[(session.session_id, session.generation)], tick=tick) == 0


# --- wake-ups on commit ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_wake_ups_are_sent_on_commit_for_enqueue_cancel_and_a_drain():
    heard: list[str] = []
    if connection.vendor == "postgresql":
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
            params.pop(key, None)
        listener = psycopg.connect(**params, autocommit=True)
        listener.execute(f"LISTEN {wakeups.CHANNEL}")

        def collect() -> list[str]:
            heard.extend(n.payload for n in listener.notifies(timeout=0.2, stop_after=100))
            return heard

    else:
        wakeups.subscribe(heard.append)

        def collect() -> list[str]:
            return heard

    try:
        session = register(enrolled_worker())
        revision = make_revision()
        run = enqueue(revision)
        wait_for(
            lambda: wakeups.WORK_PREFIX + revision.placement_sha256 in collect(), 10, "the enqueue wake-up"
        )
        held = claim_one(session)
        starting(held)
        running(held)
        heard.clear()
        run_cancel(run_id=run.pk)
        worker_wake = wakeups.WORKER_PREFIX + str(session.worker.worker_id)
        wait_for(lambda: worker_wake in collect(), 10, "the cancel wake-up")
        heard.clear()
        worker_drain(worker_id=session.worker.worker_id)
        wait_for(lambda: worker_wake in collect(), 10, "the drain wake-up")
    finally:
        if connection.vendor == "postgresql":
            listener.close()
        else:
            wakeups.unsubscribe(heard.append)


# --- a waiting claim over HTTP racing a fence ---------------------------------------------------


def wait_request(server_url: str, session, *, wait: float, offers: int = 1) -> tuple[int, dict]:
    """One signed waiting claim of ``session`` to ``server_url``: (status, answer)."""
    status, raw = wait_request_raw(server_url, session, wait=wait, offers=offers)
    return status, json.loads(raw)


def wait_request_raw(server_url: str, session, *, wait: float, offers: int = 1) -> tuple[int, bytes]:
    """:func:`wait_request`, answering the body's bytes."""
    tickets = [OfferTicket() for _ in range(offers)]
    body = {
        **session.fence(),
        "offers": [{"offerId": str(t.offer_id), "leaseToken": t.token} for t in tickets],
        "watch": [],
        "waitSeconds": wait,
    }
    raw = dumps(body)
    headers = sign_request(
        method="POST",
        path=wire.CLAIM_WAIT,
        body=raw,
        key_id=session.worker.credential_id,
        private_key=session.worker.key,
    )
    request = urllib.request.Request(
        server_url + wire.CLAIM_WAIT,
        data=raw,
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=wait + 30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _fence_by(act: str, session) -> None:
    worker_id = session.worker.worker_id
    if act == "replacement":
        register(session.worker)
    elif act == "drain":
        worker_drain(worker_id=worker_id)
    else:
        worker_revoke(worker_id=worker_id)


EXPECTED = {
    "replacement": "session_superseded",
    "drain": "session_draining",
    "revocation": "worker_revoked",
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("act", sorted(EXPECTED))
def test_a_waiting_claim_racing_a_fence_ends_fenced_and_claims_nothing(live_server, act):
    session = register(enrolled_worker())
    revision = make_revision()
    answers: list[tuple[int, dict]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(wait_request(live_server.url, session, wait=20)), daemon=True
    )
    waiting.start()
    wait_for(lambda: HUB.count >= 1, 20, "the waiting claim to wait")
    go = threading.Barrier(2)

    def enqueue_work() -> None:
        go.wait()
        try:
            enqueue(revision)
        finally:
            close_old_connections()

    enqueuer = threading.Thread(target=enqueue_work, daemon=True)
    enqueuer.start()
    go.wait()
    _fence_by(act, session)  # at the same moment as the enqueue's wake-up
    enqueuer.join(30)
    waiting.join(30)
    assert answers, "the waiting claim did not answer"
    status, body = answers[0]
    assert body.get("code") == EXPECTED[act], body
    assert status >= 400
    assert not RunDispatchLease.objects.filter(session_id=session.session_id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_answers_work_enqueued_while_it_waits_and_keeps_its_nonce_once(live_server):
    session = register(enrolled_worker())
    answers: list[tuple[int, dict]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(wait_request(live_server.url, session, wait=20)), daemon=True
    )
    waiting.start()
    wait_for(lambda: HUB.count >= 1, 20, "the waiting claim to wait")
    sent = time.monotonic()
    enqueue(make_revision())
    waiting.join(30)
    elapsed = time.monotonic() - sent
    status, body = answers[0]
    assert status == 200, body
    assert body["ended"] == "offers" and len(body["offers"]) == 1
    assert 18 <= body["waitSeconds"] <= 20  # the bound asked for, less its jitter (≤ 10 %)
    assert body["session"]["sessionId"] == str(session.session_id)
    assert elapsed < 10  # the wake-up, not the 20 s bound and not the slow re-check


@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_with_nothing_to_do_answers_at_its_bound(live_server, protocol_settings):
    protocol_settings(CLAIM_WAIT_MAX_SECONDS=1.5)
    session = register(enrolled_worker())
    started = time.monotonic()
    status, body = wait_request(live_server.url, session, wait=30)
    elapsed = time.monotonic() - started
    assert status == 200, body
    assert body["ended"] == "timeout" and body["offers"] == []
    assert 1.35 <= body["waitSeconds"] <= 1.5  # the server's bound (less its jitter), told to the worker
    assert body["waitSeconds"] - 0.1 <= elapsed < 15


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("repeated", ["offerId", "leaseToken"])
def test_a_waiting_claim_with_an_offer_twice_is_refused_before_it_waits(live_server, repeated):
    """Review of issue 18: the offers' shape rules (an offer id or lease token twice) ran only in
    ``lease_claim``, which a round calls only when work is claimable: with an empty queue such a
    claim was accepted and held for its whole wait (200 ``timeout``), and refused 400 only if
    work came. It is refused at once, as the plain claim refuses it, naming the field."""
    session = register(enrolled_worker())
    first, second = OfferTicket(), OfferTicket()
    offers = [{"offerId": str(first.offer_id), "leaseToken": first.token}]
    if repeated == "offerId":
        offers.append({"offerId": str(first.offer_id), "leaseToken": second.token})
    else:
        offers.append({"offerId": str(second.offer_id), "leaseToken": first.token})
    raw = dumps({**session.fence(), "offers": offers, "watch": [], "waitSeconds": 20})
    headers = sign_request(
        method="POST",
        path=wire.CLAIM_WAIT,
        body=raw,
        key_id=session.worker.credential_id,
        private_key=session.worker.key,
    )
    request = urllib.request.Request(
        live_server.url + wire.CLAIM_WAIT,
        data=raw,
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    started = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=40)
    body = json.loads(refused.value.read())
    assert (refused.value.code, body["code"], body["field"]) == (
        400,
        "validation_failed",
        f"offers[1].{repeated}",
    )
    assert time.monotonic() - started < 10  # not held for its 20 s wait


# --- what ends a held wait besides work: a forced rotation, a drain, a newer wait; OPTIONS ---


@pytest.mark.django_db(transaction=True)
def test_a_forced_rotation_wakes_a_waiting_claim_and_its_answer_says_so(live_server):
    """Before long polls the agent heard rotationRequired at its next heartbeat (10 s); a held
    wait postpones heartbeats, and a forced rotation neither wakes the wait nor shows in its
    timeout answer (the session read by the first round)."""
    session = register(enrolled_worker())
    answers: list[tuple[int, dict]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(wait_request(live_server.url, session, wait=12, offers=0)), daemon=True
    )
    waiting.start()
    wait_for(lambda: HUB.count >= 1, 20, "the waiting claim to wait")
    sent = time.monotonic()
    credential_force_rotation(worker_id=session.worker.worker_id)
    waiting.join(30)
    status, body = answers[0]
    assert status == 200, body
    assert body["session"]["rotationRequired"] is True, body["session"]
    assert body["ended"] == "session", body
    assert time.monotonic() - sent < 5


@pytest.mark.django_db(transaction=True)
def test_a_drain_ends_a_watch_only_wait_at_once_like_a_wait_with_offers(live_server):
    session = register(enrolled_worker())
    answers: list[tuple[int, bytes]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(wait_request_raw(live_server.url, session, wait=12, offers=0)),
        daemon=True,
    )
    waiting.start()
    wait_for(lambda: HUB.count >= 1, 20, "the waiting claim to wait")
    sent = time.monotonic()
    worker_drain(worker_id=session.worker.worker_id)
    waiting.join(30)
    status, raw = answers[0]
    body = json.loads(raw)
    assert (status, body["code"]) == (409, "session_draining"), body
    assert time.monotonic() - sent < 5
    # The same bytes as the refusal any other endpoint (DRF) renders, not only the same JSON.
    assert raw == JSONRenderer().render(body)


@pytest.mark.django_db(transaction=True)
def test_a_session_holds_at_most_two_waits_a_newer_one_supersedes_the_oldest(live_server):
    """Concurrent waits of one session (separate connections): the hub never holds more than
    MAX_WAITS_PER_SESSION of them; each one over answers at once ``superseded``."""
    session = register(enrolled_worker())
    total = 5
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()
    peak = [0]

    def one() -> None:
        answer = wait_request(live_server.url, session, wait=8, offers=0)
        with lock:
            answers.append(answer)

    def sample() -> bool:
        with HUB._lock:
            held = sum(
                1
                for waiters in HUB.by_worker.values()
                for waiter in waiters
                if waiter.session[0] == session.session_id and not waiter.superseded
            )
        peak[0] = max(peak[0], held)
        return len(answers) >= total - MAX_WAITS_PER_SESSION

    threads = [threading.Thread(target=one, daemon=True) for _ in range(total)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    wait_for(sample, 20, "the superseded waits to answer")
    superseded_by = time.monotonic() - started
    for thread in threads:
        thread.join(30)
    assert peak[0] <= MAX_WAITS_PER_SESSION
    ended = sorted(body["ended"] for status, body in answers if status == 200)
    assert len(ended) == total, answers
    assert ended.count("superseded") == total - MAX_WAITS_PER_SESSION, ended
    assert superseded_by < 6  # before the 8 s bound (less its jitter) of any of them


@pytest.mark.django_db(transaction=True)
def test_options_on_the_waiting_claim_agrees_with_its_allow_header(live_server):
    """OPTIONS is taken (answered like on the plain claim endpoint: checked like every worker
    request, never 405); another method is refused 405 with the same Allow header."""

    def ask(path: str, method: str) -> tuple[int, str | None]:
        request = urllib.request.Request(live_server.url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.headers.get("Allow")
        except urllib.error.HTTPError as error:
            return error.code, error.headers.get("Allow")

    status, allow = ask(wire.CLAIM_WAIT, "OPTIONS")
    assert allow == "POST, OPTIONS"
    assert status != 405 and status == ask(wire.CLAIM, "OPTIONS")[0], status
    assert ask(wire.CLAIM_WAIT, "GET") == (405, "POST, OPTIONS")


# --- the bound runs from the request's arrival ---------------------------------------------------


def test_the_guard_stamps_a_waiting_request_with_its_arrival_and_no_other():
    """``RequestGuard`` stamps waiting requests (only) with the loop clock when their head came."""
    seen: dict[str, dict] = {}

    def app(name: str):
        async def handle(scope, receive, send):
            seen[name] = scope
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        return handle

    guard = RequestGuard(
        app("django"),
        waiting_app=app("waiting"),
        waiting_paths=frozenset({wire.CLAIM_WAIT}),
        max_headers=64,
        max_body_bytes=1024,
        body_timeout_seconds=5,
        max_active=2,
    )

    async def call(path: str) -> float:
        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            return None

        before = asyncio.get_running_loop().time()
        await guard({"type": "http", "path": path, "headers": []}, receive, send)
        return before

    async def both() -> tuple[float, float]:
        return await call(wire.CLAIM_WAIT), await call(wire.SESSION_HEARTBEAT)

    before, _ = asyncio.run(both())
    assert RECEIVED_AT_SCOPE_KEY not in seen["django"]
    assert before <= seen["waiting"][RECEIVED_AT_SCOPE_KEY] <= before + 1.0


@pytest.mark.django_db(transaction=True)
def test_a_wait_that_queued_before_its_view_ends_by_its_bound_from_arrival(protocol_settings):
    """A request whose head arrived 1.2 s before the view ran (it queued for the pool, its checks
    were slow) answers ``timeout`` about 0.3 s later with a 1.5 s bound — not 1.5 s later."""
    protocol_settings(CLAIM_WAIT_MAX_SECONDS=1.5, HEARTBEAT_JITTER_RATIO=0)
    session = register(enrolled_worker())
    raw = dumps({**session.fence(), "offers": [], "watch": [], "waitSeconds": 30})
    headers = sign_request(
        method="POST",
        path=wire.CLAIM_WAIT,
        body=raw,
        key_id=session.worker.credential_id,
        private_key=session.worker.key,
    )

    async def wait() -> tuple[dict, float]:
        request = AsyncRequestFactory().generic(
            "POST", wire.CLAIM_WAIT, raw, content_type="application/json", headers=headers
        )
        loop = asyncio.get_running_loop()
        request.scope[RECEIVED_AT_SCOPE_KEY] = loop.time() - 1.2
        started = loop.time()
        response = await claim_wait(request)
        return json.loads(response.content), loop.time() - started

    body, took = asyncio.run(wait())
    assert body["ended"] == "timeout" and body["waitSeconds"] == 1.5, body
    assert took < 1.0, took


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_work_committed_without_a_wake_up_as_the_listen_connection_opened_is_claimed_at_its_second_look(
    live_server, protocol_settings, monkeypatch
):
    """A release or completion that found no LISTEN connection open sends no wake-up
    (core.wakeups); one that did so just as a process's connection opened commits after that
    connection's first look. The hub looks once more ``LISTEN_SETTLE_SECONDS`` after opening:
    here the work is committed with its wake-up left out just before that second look, with the
    slow re-check a minute away, and the waiting claim takes it at that look."""
    protocol_settings(CLAIM_WAIT_RECHECK_SECONDS=60)
    monkeypatch.setattr(waiting_hub, "LISTEN_SETTLE_SECONDS", 0.5)
    session = register(enrolled_worker())
    revision = make_revision()
    looks: list[float] = []
    second_look, committed = threading.Event(), threading.Event()
    wake_all = HUB._wake_all

    def looking() -> None:
        looks.append(time.monotonic())
        if len(looks) == 2:  # the hub's thread holds its second look until the work is in
            second_look.set()
            committed.wait(30)
        wake_all()

    monkeypatch.setattr(HUB, "_wake_all", looking)
    answers: list[tuple[int, dict]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(wait_request(live_server.url, session, wait=30)), daemon=True
    )
    waiting.start()
    assert second_look.wait(30), "the hub never looked a second time after its LISTEN connection opened"
    monkeypatch.setattr(wakeups, "notify", lambda payloads: None)  # as a write that found no listener
    enqueue(revision)
    committed.set()
    waiting.join(40)
    status, body = answers[0]
    assert status == 200, body
    assert body["ended"] == "offers" and len(body["offers"]) == 1, body
    assert looks[1] - looks[0] >= 0.5


def test_a_waiting_claim_for_a_host_this_control_plane_does_not_serve_is_refused_first():
    """``claim/wait`` runs without Django's middleware (``qinglong.asgi.WaitingHandler``), so it
    checks ``ALLOWED_HOSTS`` itself, before anything else, as every other road does (400
    ``host_not_allowed`` naming ``Host``, whatever the method)."""

    async def ask(method: str) -> tuple[int, dict]:
        request = AsyncRequestFactory().generic(
            method, wire.CLAIM_WAIT, b"{}", content_type="application/json", headers={"Host": "evil.example"}
        )
        response = await claim_wait(request)
        return response.status_code, json.loads(response.content)

    for method in ("POST", "OPTIONS", "GET"):
        status, body = asyncio.run(ask(method))
        assert (status, body["code"], body["field"]) == (400, "host_not_allowed", "Host"), (method, body)


@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_refused_in_the_pool_marks_the_hub_for_release():
    """A refused wait never reaches the hub, but its checks ran in the pool (``api.waiting``),
    whose thread keeps the connection they opened: the hub counts as used, so the test's release
    (``tests/conftest.py``) closes it before the test database is dropped."""
    HUB.release()
    assert not HUB.used

    async def ask() -> int:
        request = AsyncRequestFactory().generic(
            "POST", wire.CLAIM_WAIT, b'{"sessionId": "x"}', content_type="application/json"
        )
        response = await claim_wait(request)
        return response.status_code

    assert asyncio.run(ask()) == 401  # unsigned: refused by the checks, in a pool thread
    assert HUB.used
