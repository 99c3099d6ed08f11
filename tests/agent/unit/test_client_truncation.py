"""A control plane killed mid-answer: the agent's client never takes a cut-short or empty body
for an answer (it raises TransportError, so the call is retried), over a real socket."""

from __future__ import annotations

import socket
import threading

import pytest

from agent.client import Client, TransportError


def read_request(conn: socket.socket) -> None:
    """Read one whole request (headers, then Content-Length bytes of body): closing a socket with
    unread bytes sends a reset, which the client would see instead of the answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk


def serve_once(answer: bytes) -> tuple[str, threading.Thread]:
    """A one-shot HTTP server on 127.0.0.1 that reads a request, writes ``answer`` and hangs up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            read_request(conn)
            conn.sendall(answer)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", thread


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n",
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"offers": []}',
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
    ],
    ids=["headers-only", "body-cut-short", "empty-without-length"],
)
def test_a_cut_short_answer_is_a_transport_error_not_an_answer(answer):
    url, thread = serve_once(answer)
    with pytest.raises(TransportError, match="cut short"):
        Client(url, timeout=5).post("/api/v1/worker/enroll", {"token": "x"}, signed=False)
    thread.join(5)


def test_a_whole_answer_is_decoded():
    body = b'{"offers": []}'
    url, thread = serve_once(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    assert Client(url, timeout=5).post("/api/v1/worker/enroll", {"token": "x"}, signed=False) == {
        "offers": []
    }
    thread.join(5)
