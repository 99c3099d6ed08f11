"""The limits the HTTP server does not enforce itself, as one small ASGI middleware (docs/deploy.md).

``manage.py serve`` runs Granian (Rust, hyper): it bounds connections per process
(``--max-connections``), cuts off a client that has not sent its whole header block within
``QINGLONG_HEADER_TIMEOUT_SECONDS``, and refuses header blocks larger than its read buffer
(431). What is left is done here, before Django sees the request:

* more than ``QINGLONG_MAX_HEADERS`` header fields → 431 ``headers_too_large``;
* a body above ``QINGLONG_MAX_BODY_BYTES`` (declared or counted while it streams) → 413
  ``body_too_large`` (the per-endpoint limits of ``api.middleware`` stay, and are smaller);
* a body not received in full within ``QINGLONG_BODY_TIMEOUT_SECONDS`` of the request head →
  408 ``request_timeout`` and the connection is closed (a client trickling its body);
* at most ``QINGLONG_MAX_ACTIVE_REQUESTS`` requests run in Django's synchronous code at once
  per process; the others wait here, with their bodies already read, holding no thread.
  Waiting requests (``waiting_paths``, the waiting claim) take no slot: they go to
  ``waiting_app``, which waits on the event loop and runs its synchronous work in a pool of as
  many threads (``api.waiting``); each is stamped with the moment its head arrived
  (``core.conf.RECEIVED_AT_SCOPE_KEY``), from which its wait's bound runs.

The body is read here in full (it is small: the cap above) and replayed to Django, so a slow
client holds a coroutine and a socket, never a thread or a database connection.
"""

from __future__ import annotations

import asyncio
import ctypes
import io
import json
import multiprocessing
import os
import signal
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from a2wsgi.wsgi import build_environ

from core.conf import RECEIVED_AT_SCOPE_KEY, SERVE_STOP_FILE_VARIABLE

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: Any ASGI application (Django's handler types its arguments a little differently).
ASGIApp = Callable[..., Awaitable[None]]

#: Paths that never wait for a slot: liveness must answer while every slot is busy.
UNQUEUED_PATHS = frozenset({"/healthz"})


#: prctl(2) option: the signal this process gets when the thread that created it ends.
PR_SET_PDEATHSIG = 1


def exit_with_parent() -> None:
    """In a server process spawned by ``manage.py serve`` (Linux): ask the kernel to SIGKILL this
    process when serve ends, and exit at once if serve is already gone.

    Serve stops its server processes itself on SIGTERM/SIGINT; this covers a serve that is
    killed (SIGKILL, the OOM killer), whose server processes would otherwise keep serving the
    port (``SO_REUSEPORT``) and holding database connections, orphaned. Anywhere else (tests,
    other servers, other systems) it does nothing. Raises OSError if prctl refuses.
    """
    parent = multiprocessing.parent_process()
    if parent is None or SERVE_STOP_FILE_VARIABLE not in os.environ or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent.pid:  # serve died before the request above took effect
        os._exit(1)


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


class RequestGuard:
    """ASGI middleware enforcing the limits above on every HTTP request (lifespan passes through).

    ``max_headers``: header fields per request; ``max_body_bytes``: bytes; ``body_timeout_seconds``:
    seconds from the request head to the last body byte; ``max_active``: requests inside ``app``
    at once (``UNQUEUED_PATHS`` excepted). Refusals answer the API's JSON error body.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        waiting_app: ASGIApp | None = None,
        waiting_paths: frozenset[str] = frozenset(),
        max_headers: int,
        max_body_bytes: int,
        body_timeout_seconds: float,
        max_active: int,
    ) -> None:
        self.app = app
        self.waiting_app = waiting_app
        self.waiting_paths = waiting_paths
        self.max_headers = max_headers
        self.max_body_bytes = max_body_bytes
        self.body_timeout_seconds = body_timeout_seconds
        self.max_active = max_active
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        waiting = self.waiting_app is not None and scope["path"] in self.waiting_paths
        if waiting:
            scope[RECEIVED_AT_SCOPE_KEY] = asyncio.get_running_loop().time()
        try:
            self._check_head(scope)
            body = await self._read_body(receive)
        except _Refused as refused:
            await _refuse(send, refused)
            return
        replay = _Replay(body, receive)
        if waiting:
            assert self.waiting_app is not None
            await self.waiting_app(scope, replay, send)
            return
        if scope["path"] in UNQUEUED_PATHS:
            await self.app(scope, replay, send)
            return
        if self._slots is None:  # created inside the server's event loop
            self._slots = asyncio.Semaphore(self.max_active)
        async with self._slots:
            await self.app(scope, replay, send)

    def _check_head(self, scope: Scope) -> None:
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            raise _Refused(
                431,
                "headers_too_large",
                f"the request has {len(headers)} header fields; at most {self.max_headers} are accepted",
                {"limitHeaders": self.max_headers},
            )
        for name, value in headers:
            if name == b"content-length":
                if not value.isdigit():
                    raise _Refused(
                        400,
                        "content_length_invalid",
                        f"Content-Length {value[:20].decode('latin-1')!r} is not a non-negative integer",
                    )
                if int(value) > self.max_body_bytes:
                    raise self._too_large(int(value))

    def _too_large(self, length: int) -> _Refused:
        return _Refused(
            413,
            "body_too_large",
            f"the body is at least {length} bytes; this server takes at most {self.max_body_bytes}",
            {"limitBytes": self.max_body_bytes},
        )

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        break
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise self._too_large(size)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise _Refused(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.body_timeout_seconds:g} s",
            ) from None
        return b"".join(chunks)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():  # cancelled meanwhile: the client went away
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class _Replay:
    """``receive`` for the app: the body read already, then the client's own messages."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        return await self._receive()


async def _refuse(send: Send, refused: _Refused) -> None:
    body: dict[str, Any] = {"code": refused.code, "message": refused.message, "field": None}
    if refused.details:
        body["details"] = refused.details
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": refused.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class BufferedWSGI:
    """ASGI → WSGI for the worker API: the request in one hop to a pool thread and back.

    a2wsgi's adapter (``fallback``, every other path) crosses from its thread to the event loop
    for each body read, the response's start and each body chunk, and waits there each time. A
    worker request's body is already whole (``RequestGuard`` read it) and its answer is a small
    JSON document, so here the thread runs the WSGI application to the end with the body in
    memory and hands back status, headers and body together, in one callback on the loop (not
    ``run_in_executor``'s chain of two futures); the loop sends them. Measured with bench-claim's
    signed-HTTP loops (docs/performance.md). ``prefixes``: the paths served so
    (never a streaming response: the whole answer is held in memory); ``executor``: the pool the
    fallback uses too, so the threads stay one per request slot.
    """

    def __init__(self, wsgi_app: Callable, *, executor, fallback: ASGIApp, prefixes: tuple[str, ...]) -> None:
        self.wsgi_app = wsgi_app
        self.executor = executor
        self.fallback = fallback
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            await self.fallback(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:  # RequestGuard's replay: the whole body in the first message
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        environ = build_environ(scope, io.BytesIO(b"".join(chunks)))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()
        self.executor.submit(self._answer, environ, loop, answer)
        status, headers, body = await answer
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _answer(self, environ: Any, loop: asyncio.AbstractEventLoop, answer: asyncio.Future) -> None:
        """In a pool thread: run the request and hand its answer (or its exception) to ``answer``
        on the event loop in one callback."""
        settle: Callable[[asyncio.Future, Any], None] = _set_result
        try:
            outcome: Any = self._run(environ)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, which raises it
            outcome, settle = exc, _set_exception
        try:
            loop.call_soon_threadsafe(settle, answer, outcome)
        except RuntimeError:  # the loop closed meanwhile (shutdown): nobody awaits the answer
            pass

    def _run(self, environ: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        started: list = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return written.append

        written: list[bytes] = []
        result = self.wsgi_app(environ, start_response)
        try:
            written.extend(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        status, headers = started
        encoded = [
            (name.strip().lower().encode("latin-1"), value.strip().encode("latin-1"))
            for name, value in headers
        ]
        return int(status.split(" ", 1)[0]), encoded, b"".join(written)
