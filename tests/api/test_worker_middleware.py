"""The console's session, user and message middleware skip the worker API (api/middleware.py),
in sync and async mode alike, and still run for everything else."""

from __future__ import annotations

import asyncio

from django.http import HttpResponse
from django.test import RequestFactory

from api.middleware import ConsoleAuthenticationMiddleware, ConsoleMessageMiddleware, ConsoleSessionMiddleware
from protocol import wire

CHAIN = (ConsoleSessionMiddleware, ConsoleAuthenticationMiddleware, ConsoleMessageMiddleware)


def _chain(get_response):
    for middleware in reversed(CHAIN):
        get_response = middleware(get_response)
    return get_response


def _seen(request) -> set[str]:
    return {name for name in ("session", "user", "_messages") if name in request.__dict__}


def test_a_worker_request_gets_no_session_user_or_messages():
    handler = _chain(lambda request: HttpResponse("ok"))
    worker, console = RequestFactory().post(wire.SESSION_HEARTBEAT), RequestFactory().get("/admin/")
    handler(worker)
    handler(console)
    assert _seen(worker) == set()
    assert _seen(console) == {"session", "user", "_messages"}


def test_the_same_in_async_mode():
    async def respond(request):
        return HttpResponse("ok")

    handler = _chain(respond)
    worker, console = RequestFactory().post(wire.CLAIM_WAIT), RequestFactory().get("/admin/")
    assert asyncio.run(handler(worker)).status_code == 200
    asyncio.run(handler(console))
    assert _seen(worker) == set()
    assert _seen(console) == {"session", "user", "_messages"}
