"""Many simulated workers in one process, speaking the real signed worker protocol over HTTP.

Each simulated worker holds one session and one running attempt (set up through the actions,
in-process) and then, like the agent, heartbeats every heartbeat interval and renews its run lease
just before the lease midpoint, over HTTP with RFC 9421 signatures (``protocol.signing``). A small
pool of threads serves every worker from one schedule (a heap of due calls), so 200 workers cost a
few threads and a few keep-alive connections, not 200 of each. A call that gets no answer, a 5xx
or a 503 is retried with the agent's capped backoff (``agent.calls``: 0.5 s doubling, here capped
at ``backoff_max``); any other refusal is recorded — and, like the agent, the worker stops.

Every call's outcome is kept (:class:`Call`) with its monotonic send time, so a test can say what
happened after a recovery. :meth:`Fleet.finish` makes every worker complete its attempt
(``succeeded``) at its next renewal instead.
"""

from __future__ import annotations

import heapq
import http.client
import json
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from protocol import wire
from protocol.signing import sign_request
from protocol.strictjson import dumps

if TYPE_CHECKING:  # tests.helpers imports Django models; bench/chaos.py imports this before setup
    from tests.helpers import Enrolled


@dataclass
class SimulatedWorker:
    """One worker's fence: its session and its one running attempt's lease."""

    worker: Enrolled
    session_id: uuid.UUID
    generation: int
    session_version: int
    attempt_id: uuid.UUID
    lease_generation: int
    lease_token: str
    lease_version: int
    #: seconds after :meth:`Fleet.start` of this worker's first heartbeat and first renewal
    first_heartbeat: float = 0.0
    first_renew: float = 0.0
    stopped: bool = False
    completed: bool = False
    refusals: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Call:
    """One call's final outcome: ``kind`` heartbeat | renew | complete, sent at ``sent``
    (monotonic), answered ``status`` (0: no answer) with ``code`` after ``tries`` tries."""

    worker: int
    kind: str
    sent: float
    answered: float
    status: int
    code: str
    tries: int


class Fleet:
    """Drive ``workers`` against ``server`` from ``threads`` threads until :meth:`stop`."""

    def __init__(
        self,
        server: str,
        workers: list[SimulatedWorker],
        *,
        heartbeat_seconds: float,
        renew_seconds: float,
        backoff_max: float = 4.0,
        threads: int = 32,
        timeout: float = 10.0,
    ) -> None:
        parts = urlsplit(server)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.workers = workers
        self.heartbeat_seconds = heartbeat_seconds
        self.renew_seconds = renew_seconds
        self.backoff_max = backoff_max
        self.timeout = timeout
        self.calls: list[Call] = []
        #: every try's answer: (HTTP status, code), status 0 for no answer, code ``html`` for a page
        self.answers: Counter[tuple[int, str]] = Counter()
        self._finishing = False
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._queue: list[tuple[float, int, int, str, int, float]] = []  # due, seq, worker, kind, try, first
        self._seq = 0
        self._local = threading.local()
        for worker in workers:
            # spread the fleet over one period, as independent agents are
            worker.first_heartbeat = random.uniform(0, heartbeat_seconds)
            worker.first_renew = random.uniform(0, renew_seconds)
        self._threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(threads)]

    # --- schedule -------------------------------------------------------------------------------

    def _push(self, due: float, index: int, kind: str, tries: int, first: float) -> None:
        with self._lock:
            self._seq += 1
            heapq.heappush(self._queue, (due, self._seq, index, kind, tries, first))
            self._lock.notify()

    def start(self) -> None:
        """Schedule every worker's first calls (``first_heartbeat``/``first_renew`` from now) and go."""
        now = time.monotonic()
        for index, worker in enumerate(self.workers):
            self._push(now + worker.first_heartbeat, index, "heartbeat", 1, 0.0)
            self._push(now + worker.first_renew, index, "renew", 1, 0.0)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(self.timeout + 5)

    def finish(self) -> None:
        """From now on every worker's next renewal is its completion (``succeeded``, exit 0)."""
        self._finishing = True

    def done(self) -> bool:
        return all(w.completed or w.stopped for w in self.workers)

    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                while not self._stop.is_set() and (not self._queue or self._queue[0][0] > time.monotonic()):
                    wait = self._queue[0][0] - time.monotonic() if self._queue else 0.5
                    self._lock.wait(max(0.01, min(wait, 0.5)))
                if self._stop.is_set():
                    return
                _, _, index, kind, tries, first = heapq.heappop(self._queue)
            self._step(index, kind, tries, first)

    # --- one call -------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def _post(self, worker: SimulatedWorker, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, decoded body); status 0 when there was no usable answer."""
        raw = dumps(body)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        headers.update(
            sign_request(
                method="POST",
                path=path,
                body=raw,
                key_id=worker.worker.credential_id,
                private_key=worker.worker.key,
            )
        )
        conn = self._connection()
        try:
            conn.request("POST", path, body=raw, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self._local.conn = None
            return 0, {}
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            return response.status, {"code": "html" if b"<" in data[:100] else "not_json"}
        return response.status, decoded if isinstance(decoded, dict) else {}

    def _body(self, worker: SimulatedWorker, kind: str) -> tuple[str, dict[str, Any]]:
        fence = {"sessionId": str(worker.session_id), "generation": worker.generation}
        if kind == "heartbeat":
            return wire.SESSION_HEARTBEAT, {
                **fence,
                "expectedVersion": worker.session_version,
                "availableSlots": 0,
            }
        lease = {
            **fence,
            "attemptId": str(worker.attempt_id),
            "leaseGeneration": worker.lease_generation,
            "leaseToken": worker.lease_token,
        }
        if kind == "renew":
            return wire.LEASE_RENEW, {**lease, "leaseVersion": worker.lease_version}
        return wire.LEASE_COMPLETE, {
            **lease,
            "sequence": 1,
            "outcome": "succeeded",
            "exitCode": 0,
            "stdoutTail": "ok\n",
            "stderrTail": "",
        }

    def _step(self, index: int, kind: str, tries: int, first: float) -> None:
        worker = self.workers[index]
        if worker.stopped or (worker.completed and kind != "heartbeat"):
            return  # a worker that completed its attempt keeps its session, like the agent
        if kind == "renew" and self._finishing:
            kind = "complete"
        path, body = self._body(worker, kind)
        sent = time.monotonic()
        status, answer = self._post(worker, path, body)
        answered = time.monotonic()
        with self._lock:
            self.answers[(status, str(answer.get("code", "")) if status >= 400 else "")] += 1
        first = first or sent
        if status == 0 or status >= 500 or status == 429:
            delay = min(self.backoff_max, 0.5 * 2 ** (tries - 1))
            self._push(answered + random.uniform(delay / 2, delay), index, kind, tries + 1, first)
            return
        code = str(answer.get("code", "")) if status >= 400 else "ok"
        with self._lock:
            self.calls.append(Call(index, kind, first, answered, status, code, tries))
        if status >= 400:
            worker.refusals.append(f"{kind}: {status} {code}")
            worker.stopped = True  # the agent stops on an explicit refusal
            return
        if kind == "heartbeat":
            worker.session_version = answer["version"]
            self._push(sent + self.heartbeat_seconds, index, kind, 1, 0.0)
        elif kind == "renew":
            worker.lease_version = answer["lease"]["leaseVersion"]
            self._push(sent + self.renew_seconds, index, kind, 1, 0.0)
        else:
            worker.completed = True
