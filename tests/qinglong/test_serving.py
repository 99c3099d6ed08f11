"""The production server (``manage.py serve``: Granian + ``qinglong.serving.RequestGuard``) against
hostile clients, over real sockets (issue 16 acceptance):

* 300 slow clients — half trickling a request head, half a body, one byte a second — do not
  stop ``/healthz`` or a signed heartbeat from being answered within 1 s, and each is cut off
  after the documented timeout (header or body timeout, here 3 s), not before it;
* oversized heads (2,000 header fields, one 64 KiB header) are refused with 431, oversized
  bodies (declared or chunked) with 413, before Django reads them.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time

import pytest

from agent.client import Client
from protocol import wire
from tests.agent.processes import ControlPlane
from tests.helpers import enrolled_worker, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TIMEOUT = 3  # QINGLONG_HEADER_TIMEOUT_SECONDS and QINGLONG_BODY_TIMEOUT_SECONDS for these tests
SLOW = 300


@pytest.fixture
def plane(tmp_path):
    control_plane = ControlPlane(
        tmp_path,
        QINGLONG_HEADER_TIMEOUT_SECONDS=str(TIMEOUT),
        QINGLONG_BODY_TIMEOUT_SECONDS=str(TIMEOUT),
        QINGLONG_ACCESS_LOG_LEVEL="WARNING",
    )
    control_plane.start()
    yield control_plane
    control_plane.stop()


class Trickling:
    """``count`` sockets sending one byte a second each; records when the server closed each."""

    def __init__(self, port: int, count: int) -> None:
        self.sockets, self.opened, self.closed = [], [], {}
        self.answers: dict[int, bytes] = {}
        for index in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if index % 2:
                head = (
                    f"POST {wire.SESSION_HEARTBEAT} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
                )
            else:
                head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
            sock.sendall(head.encode())
            sock.setblocking(False)
            self.sockets.append(sock)
            self.opened.append(time.monotonic())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for index, sock in enumerate(self.sockets):
            selector.register(sock, selectors.EVENT_READ, index)
        next_byte = time.monotonic() + 1
        while not self._stop.is_set() and len(self.closed) < len(self.sockets):
            for key, _ in selector.select(timeout=0.05):
                try:
                    data = key.fileobj.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    self.answers[key.data] = self.answers.get(key.data, b"") + data
                    continue
                self.closed[key.data] = time.monotonic()
                selector.unregister(key.fileobj)
            if time.monotonic() >= next_byte:
                next_byte += 1
                for index, sock in enumerate(self.sockets):
                    if index not in self.closed:
                        try:
                            sock.send(b"a")
                        except (BlockingIOError, OSError):
                            pass
        selector.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.sockets:
            sock.close()


def healthz_seconds(port: int) -> float:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return time.monotonic() - started


def test_slow_clients_neither_starve_health_nor_heartbeats_and_are_cut_off_after_the_timeout(plane):
    worker = enrolled_worker()
    session = register(worker)
    client = Client(plane.url, key_id=worker.credential_id, key=worker.key, timeout=5)
    version = session.version

    slow = Trickling(plane.port, SLOW)
    try:
        time.sleep(1)  # every slow client is connected and trickling
        for _ in range(3):
            assert healthz_seconds(plane.port) < 1.0
            started = time.monotonic()
            answer = client.post(
                wire.SESSION_HEARTBEAT, {**session.fence(), "expectedVersion": version, "availableSlots": 2}
            )
            assert time.monotonic() - started < 1.0
            version = answer["version"]
            client.close()  # a fresh connection each time, like a new client among the slow ones
        deadline = slow.opened[-1] + TIMEOUT + 5
        while len(slow.closed) < SLOW and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        slow.close()

    assert len(slow.closed) == SLOW, f"{SLOW - len(slow.closed)} slow clients were never cut off"
    held = [slow.closed[i] - slow.opened[i] for i in range(SLOW)]
    assert min(held) >= TIMEOUT - 0.5, "a slow client was cut off before the documented timeout"
    assert max(held) <= TIMEOUT + 2.5, f"a slow client was held {max(held):.1f} s"
    # a trickled body is answered 408 with the JSON error (a trickled head just loses its socket)
    bodies = [slow.answers.get(i, b"") for i in range(1, SLOW, 2)]
    assert all(b.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in b for b in bodies), bodies[0][:300]


def raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-send; the answer is still there to read
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def status_and_body(answer: bytes) -> tuple[int, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    ("what", "headers", "status"),
    [
        ("2,000 header fields", b"".join(b"X-F%d: v\r\n" % i for i in range(2000)), 431),
        (
            "65 header fields (more than QINGLONG_MAX_HEADERS)",
            b"".join(b"X-F%d: v\r\n" % i for i in range(65)),
            431,
        ),
        ("one 64 KiB header", b"X-Big: " + b"a" * 65536 + b"\r\n", 431),
    ],
)
def test_oversized_request_heads_are_refused(plane, what, headers, status):
    answer = raw_request(
        plane.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers + b"\r\n"
    )
    assert answer, f"{what}: no answer at all"
    assert status_and_body(answer)[0] == status, (what, answer[:300])


def test_a_body_over_the_server_cap_is_refused_413_declared_or_chunked(plane):
    cap = 128 * 1024
    declared = raw_request(
        plane.port,
        f"POST {wire.SESSION_HEARTBEAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {cap + 1}\r\nConnection: close\r\n\r\n".encode(),
    )
    status, body = status_and_body(declared)
    assert status == 413 and json.loads(body)["code"] == "body_too_large"

    chunk = b"a" * 16384
    chunked = raw_request(
        plane.port,
        f"POST {wire.SESSION_HEARTBEAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
        + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 9
        + b"0\r\n\r\n",
    )
    status, body = status_and_body(chunked)
    assert status == 413 and json.loads(body)["details"] == {"limitBytes": cap}
