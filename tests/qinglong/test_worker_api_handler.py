"""The worker API's handler in serve (``qinglong.handlers.WorkerAPIHandler``: the middleware less
the console's) answers every worker request exactly as Django's handler with the whole list does:
status, headers and body, for answers of the hot road, of DRF's dispatch and of the middleware
and URL resolver themselves. Each request is sent once through each chain (signed afresh: a
nonce is spent once)."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.http import JsonResponse
from django.test import Client, override_settings
from django.test.client import ClientHandler
from django.urls import path

from protocol import strictjson, wire
from qinglong.handlers import WorkerAPIMiddlewareMixin
from tests.helpers import enrolled_worker, heartbeat, register, signed_headers


class _WorkerChainClientHandler(WorkerAPIMiddlewareMixin, ClientHandler):
    """Django's test client handler with the worker API's chain."""


def _clients() -> tuple[Client, Client]:
    lean = Client()
    lean.handler = _WorkerChainClientHandler(enforce_csrf_checks=False)
    return Client(), lean


def _answer(response) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers in order (less the request id, which differs by design), body."""
    headers = [(name, value) for name, value in response.headers.items() if name.lower() != "x-request-id"]
    return response.status_code, headers, response.content


def test_the_worker_chain_is_the_full_list_less_the_consoles_in_the_same_order():
    lean = settings.WORKER_API_MIDDLEWARE
    assert lean == [name for name in settings.MIDDLEWARE if name in lean]
    assert set(settings.MIDDLEWARE) - set(lean) == settings.CONSOLE_ONLY_MIDDLEWARE
    assert "api.observability.ObservabilityMiddleware" in lean
    assert "api.middleware.BodyLimitMiddleware" in lean


def _signed_case(worker, path: str, body: bytes, **headers: str):
    def send(client: Client):
        return client.generic(
            "POST",
            path,
            body,
            content_type="application/json",
            headers={**signed_headers(worker, path, body), **headers},
        )

    return send


@pytest.mark.django_db
def test_every_kind_of_worker_answer_is_the_same_through_both_chains():
    worker = enrolled_worker()
    session = register(worker)
    full, lean = _clients()
    stale = strictjson.dumps({**heartbeat(session), "generation": session.generation + 1})
    cases = {
        "stale fence (409, hot road)": _signed_case(worker, wire.SESSION_HEARTBEAT, stale),
        "malformed JSON (400)": _signed_case(worker, wire.SESSION_HEARTBEAT, b'{"sessionId": '),
        "another Accept (406, DRF)": _signed_case(worker, wire.SESSION_HEARTBEAT, stale, Accept="text/html"),
        "unsigned (401)": lambda c: c.post(wire.CLAIM, b"{}", content_type="application/json"),
        "wrong method (405)": lambda c: c.get(wire.CLAIM),
        "OPTIONS (DRF metadata)": lambda c: c.options(wire.CLAIM),
        "unknown endpoint (404)": lambda c: c.post(wire.API_PREFIX + "no/such", b"{}", "application/json"),
        "trailing slash": lambda c: c.post(wire.CLAIM + "/", b"{}", content_type="application/json"),
        "NUL in the path (400)": lambda c: c.post(wire.CLAIM + "%00", b"{}", "application/json"),
        "body over the limit (413)": lambda c: c.post(wire.CLAIM, b"x" * 300_000, "application/json"),
        "Content-Length not a number (400)": lambda c: c.generic(
            "POST", wire.CLAIM, b"{}", content_type="application/json", CONTENT_LENGTH="12x"
        ),
    }
    for name, send in cases.items():
        by_full, by_lean = _answer(send(full)), _answer(send(lean))
        assert by_lean == by_full, name
        assert by_lean[0] >= 400 or name.startswith("OPTIONS"), (name, by_lean)
        assert json.loads(by_lean[2]), name  # the API's JSON, never an HTML page

    # an accepted heartbeat: the same status and headers, the same fields (its times move on)
    body = strictjson.dumps(heartbeat(session))
    first = _answer(_signed_case(worker, wire.SESSION_HEARTBEAT, body)(full))
    second = _answer(_signed_case(worker, wire.SESSION_HEARTBEAT, body)(lean))
    assert first[0] == second[0] == 200
    assert [name for name, _ in first[1]] == [name for name, _ in second[1]]
    sized = {"Content-Length"}  # the times in the body may differ in length
    assert [h for h in first[1] if h[0] not in sized] == [h for h in second[1] if h[0] not in sized]
    assert json.loads(first[2]).keys() == json.loads(second[2]).keys()


def _echo(request, **kwargs):
    match = request.resolver_match
    return JsonResponse({"route": match.route, "match": id(match), **kwargs})


urlpatterns = [
    path("api/v1/worker/fixed", _echo, name="fixed"),
    path("api/v1/worker/item/<int:number>", _echo, name="item"),
]


def test_the_worker_chain_keeps_a_fixed_paths_match_and_resolves_the_rest_each_time():
    """A fixed path is resolved once per handler and URLconf: its later requests get the same
    match. A path with URL arguments is resolved on every request, and a changed ``ROOT_URLCONF``
    is resolved under its own resolver (the 404s of paths that match nothing: the test above)."""
    _, lean = _clients()
    with override_settings(ROOT_URLCONF=__name__):
        fixed = [lean.get("/api/v1/worker/fixed").json() for _ in range(3)]
        items = [lean.get(f"/api/v1/worker/item/{number}").json() for number in (1, 1, 2)]
    assert {answer["route"] for answer in fixed} == {"api/v1/worker/fixed"}
    assert len({answer["match"] for answer in fixed}) == 1
    assert [answer["number"] for answer in items] == [1, 1, 2]
    assert len({answer["match"] for answer in items}) == 3
    with override_settings(ROOT_URLCONF="qinglong.urls"):
        assert lean.get("/api/v1/worker/fixed").status_code == 404  # not the other URLconf's match
