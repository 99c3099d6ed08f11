"""A small HTTP client for the worker API: signed JSON POSTs over ``http.client``.

One keep-alive connection per thread (the heartbeat timer, the claim loop and each attempt
runner talk independently, so a slow call in one never delays another's). Every request is
signed with the worker's key under the RFC 9421 profile (``protocol.signer``, PyNaCl). Errors:

* :class:`ApiError` — the server answered with a JSON error (``code``, ``message``, ``field``);
* :class:`TransportError` — no answer (connection refused/reset, timeout, non-JSON body).

A kept-alive connection the server closed while it sat idle (its keep-alive timeout: the
heartbeat thread's connection idles while waiting claims keep the session alive) is not an
error: a request that finds it closed — refused on send, or hung up on before any answer byte —
is signed afresh and sent once more on a new connection, quietly (``STALE_ERRORS``).
"""

from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import urlsplit

from protocol.signer import Signer, sign_request
from protocol.strictjson import dumps

#: Seconds before one request gives up by default, and the most ``--timeout`` may set.
DEFAULT_TIMEOUT = 15.0
MAX_TIMEOUT = 60.0
#: Largest response body the agent reads (a claim answer's offers are at most 128 KiB).
MAX_RESPONSE_BYTES = 256 * 1024
#: What a request on a reused keep-alive connection meets when the server had closed it while it
#: sat idle: the send refused, or a hang-up before any byte of an answer. Sent again once, on a
#: new connection (a fresh connection failing so is an error like any other).
STALE_ERRORS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, http.client.RemoteDisconnected)

log = logging.getLogger("qinglong.agent")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.details = details or {}
        self.retry_after = retry_after
        super().__init__(f"{status} {code}: {message}" + (f" ({field})" if field else ""))


class TransportError(Exception):
    """The control plane could not be reached or answered garbage."""


class Client:
    def __init__(
        self,
        server: str,
        *,
        key_id: str | None = None,
        key: Signer | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server must be an http(s) URL, not {server!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.base_path = parts.path.rstrip("/")
        self.key_id = key_id
        self.key = key
        self.timeout = timeout
        #: Seconds to add to this machine's clock to get the server's (see _learn_clock).
        self.clock_offset = 0.0
        #: The last ``Date`` header read and the instant it names (parsed once per second).
        self._last_date: tuple[str, float] = ("", 0.0)
        self._local = threading.local()
        #: Connections of long polls in flight (see :meth:`interrupt`), and those it cut.
        self._waiting: set[http.client.HTTPConnection] = set()
        self._cut: set[http.client.HTTPConnection] = set()
        self._waiting_lock = threading.Lock()

    def with_key(self, key_id: str, key: Signer) -> Client:
        """A client for the same server signing with another key (used by key rotation)."""
        rotated = Client(
            f"{self.scheme}://{self.host}{':' + str(self.port) if self.port else ''}{self.base_path}",
            key_id=key_id,
            key=key,
            timeout=self.timeout,
        )
        rotated.clock_offset = self.clock_offset
        return rotated

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def _learn_clock(self, date_header: str | None) -> None:
        """Align signatures' ``created`` with the server's clock (its ``Date`` header).

        The server checks the signature window against its own clock only, and allows a
        ``created`` at most a couple of seconds ahead of it. ``Date`` is stamped before this
        machine reads it and rounds down to the second, so the measured offset never exceeds the
        true one: signing with ``time.time() + offset`` keeps ``created`` at or behind the
        server's clock, however this machine's clock drifts.
        """
        if not date_header:
            return
        seen, server = self._last_date
        if date_header != seen:  # a new second: parse it (the same header is the same instant)
            try:
                server = email.utils.parsedate_to_datetime(date_header).timestamp()
            except (TypeError, ValueError):
                return
            self._last_date = (date_header, server)
        self.clock_offset = server - time.time()

    def interrupt(self) -> None:
        """Cut every long poll in flight short (any thread): its ``post`` raises TransportError.

        Only for a request whose lost answer costs nothing (a watch without offers), or when the
        agent is stopping anyway: an interrupted claim's offers are claimed but not learned."""
        with self._waiting_lock:
            waiting = list(self._waiting)
            self._cut.update(waiting)  # their failure is the interruption, never a stale connection
        for conn in waiting:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _headers(self, target: str, payload: bytes, signed: bool) -> dict[str, str]:
        """The request's headers, signed now (a fresh nonce and ``created`` for every send)."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if signed:
            if self.key is None or self.key_id is None:
                raise RuntimeError("a signed request needs a key")
            created = datetime.datetime.fromtimestamp(time.time() + self.clock_offset, datetime.UTC)
            headers.update(
                sign_request(
                    method="POST",
                    path=target,
                    body=payload,
                    key_id=self.key_id,
                    private_key=self.key,
                    created=created,
                )
            )
        return headers

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        target: str,
        payload: bytes,
        headers: dict[str, str],
        seconds: float,
        interruptible: bool,
    ) -> http.client.HTTPResponse:
        """Send one request on ``conn`` and read its answer's status line and headers."""
        conn.timeout = seconds
        if conn.sock is not None:
            conn.sock.settimeout(seconds)
        if interruptible:
            with self._waiting_lock:
                self._waiting.add(conn)
        try:
            conn.request("POST", target, body=payload, headers=headers)
            return conn.getresponse()
        finally:
            if interruptible:
                with self._waiting_lock:
                    self._waiting.discard(conn)

    def _read(
        self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, interruptible: bool
    ) -> bytes:
        """The answer's body, at most MAX_RESPONSE_BYTES + 1 bytes (``interrupt`` may cut it)."""
        if interruptible:
            with self._waiting_lock:
                self._waiting.add(conn)
        try:
            return response.read(MAX_RESPONSE_BYTES + 1)
        finally:
            if interruptible:
                with self._waiting_lock:
                    self._waiting.discard(conn)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def post(
        self,
        path: str,
        body: Mapping[str, object],
        *,
        signed: bool = True,
        timeout: float | None = None,
        interruptible: bool = False,
    ) -> dict[str, Any]:
        """POST ``body`` as JSON to ``path``; return the decoded JSON answer.

        ``timeout``: seconds for this request instead of the client's (a long poll waits longer);
        ``interruptible``: :meth:`interrupt` may cut it short.
        Raises ApiError for an error answer, TransportError when there is no usable answer.
        """
        payload = dumps(body)
        target = self.base_path + path
        seconds = self.timeout if timeout is None else timeout
        while True:
            conn = self._connection()
            reused = conn.sock is not None
            answered = False
            try:
                response = self._exchange(
                    conn, target, payload, self._headers(target, payload, signed), seconds, interruptible
                )
                answered = True  # the status line arrived: whatever fails now is no stale connection
                data = self._read(conn, response, interruptible)
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                with self._waiting_lock:
                    cut = conn in self._cut
                    self._cut.discard(conn)
                if reused and not answered and not cut and isinstance(exc, STALE_ERRORS):
                    # The server closed this connection while it sat idle: not an error.
                    log.debug("POST %s: the kept-alive connection was closed (%r); reconnecting", path, exc)
                    continue
                raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            with self._waiting_lock:
                self._cut.discard(conn)  # an interruption that came after the answer cut nothing
            break
        self._learn_clock(response.getheader("Date"))
        if response.getheader("Connection", "").lower() == "close":
            self.close()
        if len(data) > MAX_RESPONSE_BYTES:
            self.close()
            raise TransportError("response larger than the agent accepts")
        # read(n) does not raise on a body cut short (a control plane killed mid-answer): compare
        # with Content-Length, and never take an empty body for an answer. The call is retried
        # (every worker call is idempotent: a claim replays its offers).
        length = response.getheader("Content-Length")
        if not data or (length is not None and length.isdigit() and int(length) != len(data)):
            self.close()
            raise TransportError(f"HTTP {response.status} answer cut short ({len(data)} of {length} bytes)")
        try:
            decoded = json.loads(data)
        except ValueError as exc:
            raise TransportError(f"HTTP {response.status} with a non-JSON body") from exc
        if response.status >= 400:
            if not isinstance(decoded, dict) or "code" not in decoded:
                raise TransportError(f"HTTP {response.status} without an error code")
            retry_after = response.getheader("Retry-After")
            raise ApiError(
                response.status,
                decoded["code"],
                decoded.get("message", ""),
                decoded.get("field"),
                decoded.get("details"),
                float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None,
            )
        return cast(dict[str, Any], decoded)  # every worker endpoint answers a JSON object
