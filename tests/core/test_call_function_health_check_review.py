"""A hot lease call on a kept connection that PostgreSQL closed reconnects, as every other call does
(``core.db.call_function``; Django's ``CONN_HEALTH_CHECKS``).

Outside ``manage.py serve``'s pool — ``QINGLONG_SERVE_DB_POOL=0``, another server on
``qinglong.asgi``/``wsgi`` — a thread keeps its connection (``CONN_MAX_AGE`` 60 s) and Django checks it
once per request before its first use (``CONN_HEALTH_CHECKS``, settings): a connection PostgreSQL
closed in between (a restart, a failover, ``pg_terminate_backend``, ``idle_session_timeout``) is
replaced, and the request never sees it. Django runs that check in ``connection.cursor()`` and in
``transaction.atomic`` (``set_autocommit``). The lease calls' database path runs its server
function outside any ``atomic`` through ``call_function``, which at first only called
``ensure_connection()`` (now it runs the check first, as ``cursor()`` does): the check was skipped,
the statement went to the dead connection, and the renewal failed with ``OperationalError`` (503
``database_unavailable`` at the API, a missed renewal for the worker) where the same request
before this change — or any ORM write path, such as the heartbeat here — reconnected and
succeeded.

The request cycle is the real one: ``request_started``/``request_finished`` (Django's
``close_old_connections``) between the calls; the backend is terminated from a second connection.
"""

from __future__ import annotations

import psycopg
import pytest
from django.core import signals
from django.db import connection

from actions.sessions.heartbeat import session_heartbeat
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, renew, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _terminate_this_threads_backend() -> None:
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as observer:
        observer.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def _next_request() -> None:
    signals.request_finished.send(sender=None)
    signals.request_started.send(sender=None)


def test_a_renewal_on_a_kept_connection_postgresql_closed_reconnects_like_the_heartbeat():
    assert connection.settings_dict["CONN_HEALTH_CHECKS"] and connection.settings_dict["CONN_MAX_AGE"]
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = start(claim_one(session))
    _next_request()
    renew(held)  # the kept connection works

    # Control: an ORM/cursor path on a connection PostgreSQL closed between two requests.
    _terminate_this_threads_backend()
    _next_request()
    session_heartbeat(
        worker_id=session.worker.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        expected_version=session.version,
        available_slots=1,
    )

    # The same for a renewal (its database path: ql_lease_release with a renewal interval).
    _terminate_this_threads_backend()
    _next_request()
    result = renew(held)
    assert result.status == "renewed"
