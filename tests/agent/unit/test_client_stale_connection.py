"""A kept-alive connection the server closed while it sat idle (its keep-alive timeout) is not an
error: the agent's client reconnects once, quietly, and the call gets its answer — over real
sockets. A fresh connection that fails, or a request already answered in part, stays an error."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

from agent.client import Client, TransportError
from tests.agent.unit.test_client_truncation import read_request

BODY = b'{"ok": true}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)


class KeepAliveServer:
    """Answers each connection's requests; after ``per_connection`` answers it closes the
    connection (as a server does with an idle keep-alive connection) and accepts the next."""

    def __init__(self, per_connection: int = 1) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.per_connection = per_connection
        self.connections = 0
        self.requests = 0
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _run(self) -> None:
        with self.listener:
            while True:
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    return
                self.connections += 1
                with conn:
                    for _ in range(self.per_connection):
                        read_request(conn)
                        self.requests += 1
                        conn.sendall(ANSWER)
                self.closed.set()  # closed after its answers, with the client's socket still open

    def stop(self) -> None:
        self.listener.close()


@pytest.fixture
def server():
    running = KeepAliveServer()
    yield running
    running.stop()


def test_a_connection_closed_while_idle_is_reopened_quietly(server, caplog):
    client = Client(server.url, timeout=5)
    assert client.post("/api/v1/worker/enroll", {"token": "x"}, signed=False) == {"ok": True}
    assert server.closed.wait(5)  # the server hung up on the idle keep-alive connection
    with caplog.at_level(logging.INFO, logger="qinglong.agent"):
        assert client.post("/api/v1/worker/enroll", {"token": "x"}, signed=False) == {"ok": True}
    assert server.connections == 2 and server.requests == 2
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text


def test_a_fresh_connection_that_is_hung_up_on_is_an_error():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def hang_up() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            read_request(conn)  # then close without an answer

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    with pytest.raises(TransportError, match="RemoteDisconnected"):
        Client(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=5).post(
            "/api/v1/worker/enroll", {"token": "x"}, signed=False
        )
    thread.join(5)


def test_an_interrupted_long_poll_is_not_sent_again():
    """``Client.interrupt`` cuts a reused connection's long poll: that is the interruption the
    caller asked for (a TransportError), never a stale connection to reopen."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    seen: list[int] = []
    holding = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            read_request(conn)
            conn.sendall(ANSWER)
            read_request(conn)  # the long poll: held, never answered
            seen.append(1)
            holding.set()
            conn.recv(1)  # until the client cuts it
        listener.settimeout(1.0)
        try:
            again, _ = listener.accept()  # a resend would arrive here
            seen.append(2)
            again.close()
        except OSError:
            pass
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = Client(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=5)
    result: list[BaseException] = []

    def poll() -> None:  # connections are per thread: both requests on this one's
        assert client.post("/api/v1/worker/claim/wait", {}, signed=False) == {"ok": True}
        try:
            client.post("/api/v1/worker/claim/wait", {}, signed=False, timeout=5, interruptible=True)
        except TransportError as exc:
            result.append(exc)

    poller = threading.Thread(target=poll)
    poller.start()
    assert holding.wait(5)
    client.interrupt()
    poller.join(5)
    thread.join(5)
    assert len(result) == 1 and seen == [1]
