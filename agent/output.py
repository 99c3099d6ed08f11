"""Live job output: a bounded buffer fed by the pipe readers, and the shipper that sends it to the
control plane in fenced, numbered chunks (docs/logs.md, The agent's side).

* The readers (``agent.executor``) only append to :class:`OutputBuffer` under a lock: a slow or
  absent control plane never blocks the job's pipes, so it never slows the job.
* The buffer holds at most ``limit`` bytes; when full it drops its *oldest* bytes. Every piece
  keeps its stream's monotonic offset, so the chunk after a drop starts past the bytes that were
  lost and the control plane writes a gap marker there (a drop at the very end is reported by a
  last, empty chunk carrying the final offset).
* :class:`LogShipper` sends a chunk when ``LOG_CHUNK_BYTES`` are waiting or the server's
  ``intervalSeconds`` elapsed, one at a time, each with the next sequence number. A chunk that
  could not be sent is kept (at most one chunk besides the buffer) and sent again with the same
  number; an exact replay is idempotent on the server. A ``log_backpressure`` answer (429) is
  retried after its Retry-After. When the log reached its cap the shipper discards the rest.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from protocol.masking import StreamMasker
from protocol.wire import LOG_CHUNK_BYTES, LOG_STREAMS, MAX_LOG_SEGMENTS

from .calls import Stop
from .client import ApiError, TransportError

log = logging.getLogger("qinglong.agent")

#: Bytes of output one attempt may hold while the control plane does not take them.
BUFFER_BYTES = 1024 * 1024
#: Seconds between sends until the server says otherwise.
DEFAULT_INTERVAL = 3.0
#: Longest interval the agent honours (a misconfigured server must not silence a log).
MAX_INTERVAL = 30.0
#: How long one send keeps retrying before the shipper goes back to reading (seconds).
SEND_PATIENCE = 5.0


#: One stream's contiguous bytes: (stream, offset of the first byte in that stream, bytes).
Segment = tuple[str, int, bytes]


class OutputBuffer:
    """A bounded FIFO of ``(stream, offset, bytes)`` pieces, oldest dropped first when full."""

    def __init__(self, limit: int = BUFFER_BYTES, secrets: list[bytes] | None = None) -> None:
        """``secrets``: values masked before anything is buffered (``protocol.masking``); the
        offsets count the masked bytes, which are what the control plane receives."""
        self.limit = limit
        self._maskers = {stream: StreamMasker(secrets or []) for stream in LOG_STREAMS}
        self._pieces: deque[tuple[str, int, bytes]] = deque()
        self._size = 0
        self._lock = threading.Lock()
        #: {stream: offset of the next byte read from it} (bytes of the stream so far).
        self.read_offsets = dict.fromkeys(LOG_STREAMS, 0)
        #: Bytes dropped because the buffer was full, per stream.
        self.dropped = dict.fromkeys(LOG_STREAMS, 0)
        self.data_ready = threading.Event()
        self.discarding = False

    @property
    def size(self) -> int:
        return self._size

    def write(self, stream: str, data: bytes) -> None:
        """Append bytes read from ``stream``; never blocks beyond the lock, never grows past
        ``limit`` (the oldest bytes go first)."""
        with self._lock:
            self._append(stream, self._maskers[stream].feed(data))
        if self._size >= LOG_CHUNK_BYTES:
            self.data_ready.set()

    def end_streams(self) -> None:
        """Both streams ended (the job exited, its pipes drained): buffer the bytes each masker
        held back as a possible secret's beginning."""
        with self._lock:
            for stream, masker in self._maskers.items():
                self._append(stream, masker.flush())
        self.data_ready.set()

    def _append(self, stream: str, data: bytes) -> None:
        """Buffer masked bytes of ``stream`` (the lock is held)."""
        offset = self.read_offsets[stream]
        self.read_offsets[stream] = offset + len(data)
        if self.discarding or not data:
            return
        self._pieces.append((stream, offset, data))
        self._size += len(data)
        while self._size > self.limit:
            old_stream, old_offset, old = self._pieces.popleft()
            excess = self._size - self.limit
            if len(old) > excess:  # keep the newest part of the oldest piece
                self._pieces.appendleft((old_stream, old_offset + excess, old[excess:]))
                self._size -= excess
                self.dropped[old_stream] += excess
            else:
                self._size -= len(old)
                self.dropped[old_stream] += len(old)

    def take(self, max_bytes: int = LOG_CHUNK_BYTES) -> list[Segment]:
        """Remove and return the oldest bytes (≤ ``max_bytes``, ≤ ``MAX_LOG_SEGMENTS`` segments)
        as segments in read order, contiguous bytes of one stream merged."""
        segments: list[Segment] = []
        taken = 0
        with self._lock:
            while self._pieces and taken < max_bytes:
                stream, offset, data = self._pieces[0]
                room = max_bytes - taken
                last = segments[-1] if segments else None
                if last is not None and last[0] == stream and last[1] + len(last[2]) == offset:
                    merge = True
                elif len(segments) >= MAX_LOG_SEGMENTS:
                    break
                else:
                    merge = False
                self._pieces.popleft()
                if len(data) > room:
                    self._pieces.appendleft((stream, offset + room, data[room:]))
                    data = data[:room]
                if merge and last is not None:
                    segments[-1] = (stream, last[1], last[2] + data)
                else:
                    segments.append((stream, offset, data))
                taken += len(data)
            self._size -= taken
        return segments

    def discard(self) -> None:
        """Drop everything and keep nothing more (the log reached its cap)."""
        with self._lock:
            self.discarding = True
            self._pieces.clear()
            self._size = 0


Send = Callable[[Mapping[str, object], float], dict[str, Any]]


class LogShipper(threading.Thread):
    """Sends one attempt's buffered output in numbered chunks (see the module docstring).

    ``send(body_without_fence, patience)`` makes the signed, fenced call and returns the answer
    (it raises ``ApiError``/``TransportError`` like ``Agent.call``)."""

    def __init__(self, buffer: OutputBuffer, send: Send, name: str = "log-shipper") -> None:
        super().__init__(name=name, daemon=True)
        self.buffer = buffer
        self._send = send
        self.seq = 1
        self.interval = DEFAULT_INTERVAL
        self._pending: list[Segment] | None = None
        #: {stream: the offset just after the last byte the server accepted}.
        self.sent_ends = dict.fromkeys(LOG_STREAMS, 0)
        self._halt = threading.Event()
        self._finishing = threading.Event()
        self.lost = False  # the lease is no longer ours: nothing more can be sent
        self.truncated = False
        self.chunks_sent = 0

    def stop(self) -> None:
        """Stop at once, sending nothing more (the attempt was abandoned)."""
        self._halt.set()
        self.buffer.data_ready.set()

    def finish(self, timeout: float) -> bool:
        """Send everything still buffered (the job has exited and its pipes are drained), then
        report a trailing drop; wait up to ``timeout`` seconds. True if all was sent."""
        self.buffer.end_streams()
        self._finishing.set()
        self.join(timeout)
        if self.is_alive():
            self.stop()
            return False
        return not self.lost and self._pending is None and self.buffer.size == 0

    def run(self) -> None:
        while not self._halt.is_set():
            finishing = self._finishing.is_set()
            if not finishing:
                self.buffer.data_ready.wait(self.interval)
                self.buffer.data_ready.clear()
            if self._halt.is_set():
                return
            if not self._ship_all(finishing):
                if finishing and (self.lost or self.truncated):
                    return
                if finishing:
                    self._halt.wait(min(self.interval, 1.0))  # the control plane is away: try again
                continue
            if finishing:
                self._report_trailing_drop()
                return

    def _ship_all(self, finishing: bool) -> bool:
        """Send what is buffered; False when a send failed (the chunk stays pending)."""
        while not self._halt.is_set():
            if self.truncated or self.lost:
                return not self.lost
            chunk = self._pending or self.buffer.take()
            if not chunk:
                return True
            self._pending = chunk
            if not self._ship(chunk):
                return False
            self._pending = None
            if not finishing and self.buffer.size < LOG_CHUNK_BYTES:
                return True  # a partial chunk waits for the next interval
        return True

    def _ship(self, chunk: list[Segment]) -> bool:
        body = {
            "seq": self.seq,
            "segments": [
                {"stream": stream, "offset": offset, "content": base64.b64encode(data).decode("ascii")}
                for stream, offset, data in chunk
            ],
        }
        try:
            answer = self._send(body, SEND_PATIENCE)
        except TransportError as exc:
            log.info("log chunk %s not sent yet: %s", self.seq, exc)
            return False
        except Stop:  # the session is fenced: the agent stops every attempt
            self.lost = True
            self.buffer.discard()
            return False
        except ApiError as exc:
            if exc.status == 429 or exc.status >= 500:
                log.info("log chunk %s deferred: %s", self.seq, exc)
                return False
            log.warning("log chunk %s refused, the log stops here: %s", self.seq, exc)
            self.lost = True
            self.buffer.discard()
            return False
        self.seq += 1
        self.chunks_sent += 1
        for stream, offset, data in chunk:
            self.sent_ends[stream] = offset + len(data)
        interval = answer.get("intervalSeconds")
        if isinstance(interval, int | float) and interval > 0:
            self.interval = min(float(interval), MAX_INTERVAL)
        if answer.get("truncated"):
            self.truncated = True
            self.buffer.discard()
        return True

    def _report_trailing_drop(self) -> None:
        """An empty chunk at the final offset of a stream whose last bytes were dropped."""
        if self.truncated or self.lost:
            return
        for stream in LOG_STREAMS:
            end = self.buffer.read_offsets[stream]
            if end > self.sent_ends[stream] and self.buffer.dropped[stream]:
                self._ship([(stream, end, b"")])
