"""The worker API's buffered road to Django (``qinglong.serving.BufferedWSGI``) answers exactly what
a2wsgi's adapter answers for the same request: status, headers in order, body — with Django's real
WSGI handler and middleware, for answers with and without a body, and for a response written in
several chunks. Other paths are passed to the fallback untouched.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from a2wsgi import WSGIMiddleware
from django.core.wsgi import get_wsgi_application

from protocol import wire
from qinglong.serving import BufferedWSGI


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }


def _answer(app, method: str, path: str, body: bytes = b"", headers=()) -> tuple[int, list, bytes]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    header_list = [(b"host", b"127.0.0.1:8000"), (b"content-length", str(len(body)).encode()), *headers]
    asyncio.run(app(_scope(method, path, header_list), receive, send))
    start = sent[0]
    assert start["type"] == "http.response.start"
    return (
        start["status"],
        [tuple(h) for h in start["headers"]],
        b"".join(m.get("body", b"") for m in sent[1:]),
    )


@pytest.fixture(scope="module")
def roads():
    wsgi = get_wsgi_application()
    pooled = WSGIMiddleware(wsgi, workers=2)
    buffered = BufferedWSGI(wsgi, executor=pooled.executor, fallback=pooled, prefixes=(wire.API_PREFIX,))
    return pooled, buffered


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", wire.CLAIM, b'{"sessionId": 1}', 401),  # unsigned
        ("GET", wire.ENROLL, b"", 405),
        ("POST", wire.API_PREFIX + "no/such/endpoint", b"{}", 404),
        ("POST", wire.CLAIM, b"x" * 300_000, 413),  # over the endpoint's body limit
    ],
)
@pytest.mark.django_db
def test_the_buffered_road_answers_byte_for_byte_what_a2wsgi_answers(roads, method, path, body, status):
    pooled, buffered = roads
    headers = [(b"content-type", b"application/json")]
    by_buffer = _stable(*_answer(buffered, method, path, body, headers))
    assert by_buffer == _stable(*_answer(pooled, method, path, body, headers))
    assert by_buffer[0] == status and by_buffer[2].startswith(b"{")


def _stable(status: int, headers: list, body: bytes) -> tuple[int, list, bytes]:
    """The answer minus its request id header (it differs between two requests by design)."""
    return status, [h for h in headers if h[0] != b"x-request-id"], body


def test_a_response_in_several_chunks_arrives_whole_and_other_paths_go_to_the_fallback():
    def chunky(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("X-Path", environ["PATH_INFO"])])
        return iter([b"one ", b"two ", environ["wsgi.input"].read()])

    seen: list[str] = []

    async def fallback(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    pooled = WSGIMiddleware(chunky, workers=1)
    buffered = BufferedWSGI(chunky, executor=pooled.executor, fallback=fallback, prefixes=(wire.API_PREFIX,))
    assert _answer(buffered, "POST", wire.CLAIM, b"three") == (
        200,
        [(b"content-type", b"text/plain"), (b"x-path", wire.CLAIM.encode())],
        b"one two three",
    )
    assert _answer(buffered, "GET", "/admin/", b"")[0] == 204
    assert seen == ["/admin/"]


def test_an_exception_in_the_application_reaches_the_awaiting_request():
    def broken(environ, start_response):
        raise LookupError("the application failed")

    pooled = WSGIMiddleware(broken, workers=1)
    buffered = BufferedWSGI(broken, executor=pooled.executor, fallback=pooled, prefixes=(wire.API_PREFIX,))
    with pytest.raises(LookupError, match="the application failed"):
        _answer(buffered, "POST", wire.CLAIM, b"{}")


def test_a_request_cancelled_while_its_thread_runs_leaves_the_loop_without_an_error():
    """The client went away (the server cancels the request's task) while a pool thread still ran
    it: the answer the thread hands back later finds a cancelled future and is dropped, and the
    event loop reports no exception from that callback."""
    release = threading.Event()

    def slow(environ, start_response):
        release.wait(5)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"late"]

    pooled = WSGIMiddleware(slow, workers=1)
    buffered = BufferedWSGI(slow, executor=pooled.executor, fallback=pooled, prefixes=(wire.API_PREFIX,))
    reported: list[dict] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            raise AssertionError("a cancelled request sends nothing")

        headers = [(b"host", b"127.0.0.1:8000"), (b"content-length", b"0")]
        task = asyncio.create_task(buffered(_scope("POST", wire.CLAIM, headers), receive, send))
        await asyncio.sleep(0.05)  # the thread is inside the application now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await asyncio.get_running_loop().run_in_executor(None, pooled.executor.shutdown, True)
        await asyncio.sleep(0.05)  # the thread's hand-back callback has run

    asyncio.run(scenario())
    assert reported == []
