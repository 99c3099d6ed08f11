"""Running one attempt as a local subprocess: own process group, enforced timeout, bounded output.

The job runs under a small guard (``agent/guard.py``) that starts a new session, so the guard's
pid is the job's process group id; on Linux the guard also adopts the orphans of the job's tree
(child subreaper), so it reaches processes that left the group. Stopping asks the guard to send
SIGTERM to the whole tree, then SIGKILL after a grace period. The guard also ends the job if this
agent dies, so a job never outlives the process that holds its lease. Output is drained by two
reader threads that keep only the last ``OUTPUT_TAIL_BYTES`` of each stream, so a chatty job
cannot grow the agent's memory; given an ``agent.output.OutputBuffer`` they also hand every
block read to it (a bounded, non-blocking append) for the live log.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from protocol.wire import OUTPUT_TAIL_BYTES

from .guard import COOKIE_VARIABLE, end_processes
from .output import OutputBuffer

KILL_GRACE_SECONDS = 5.0
#: How much longer than the grace the agent gives the guard to end a job before doing it itself.
GUARD_SLACK_SECONDS = 2.0
GUARD = Path(__file__).with_name("guard.py")
INTERPRETERS = {"python": ["python3"], "node": ["node"]}


class StartFailed(Exception):
    """The executor could not start the process (missing interpreter, bad work dir, …)."""


class _Tail:
    """Keeps the last ``limit`` bytes read from a stream, handing each block to ``sink`` too."""

    def __init__(
        self,
        stream: IO[bytes],
        limit: int = OUTPUT_TAIL_BYTES,
        sink: tuple[OutputBuffer, str] | None = None,
    ) -> None:
        self.limit = limit
        self.sink = sink
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream: IO[bytes]) -> None:
        with stream:
            while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
                if self.sink is not None:
                    self.sink[0].write(self.sink[1], chunk)
                self.chunks.append(chunk)
                self.size += len(chunk)
                while self.size - len(self.chunks[0]) >= self.limit:
                    self.size -= len(self.chunks.popleft())

    def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the stream's end; True once it was read to EOF."""
        self.thread.join(timeout=timeout)
        return not self.thread.is_alive()

    def text(self) -> str:
        """The tail as UTF-8 text: invalid bytes and NUL replaced, at most ``limit`` bytes."""
        self.thread.join(timeout=2)
        data = b"".join(self.chunks)[-self.limit :]
        text = data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        encoded = text.encode("utf-8")
        if len(encoded) > self.limit:
            text = encoded[-self.limit :].decode("utf-8", errors="ignore")
        return text


@dataclass(frozen=True)
class Result:
    outcome: str  # succeeded | failed | timed_out | cancelled
    exit_code: int | None
    stdout_tail: str
    stderr_tail: str


class Execution:
    """One started process. ``wait(timeout)`` polls it; ``stop(outcome)`` ends it early."""

    def __init__(
        self,
        *,
        executor: str,
        command: str,
        env: dict[str, str],
        timeout_seconds: int,
        work_dir: Path,
        kill_in: float | None = None,
        user: str | None = None,
        output: OutputBuffer | None = None,
    ) -> None:
        """Start the job under its guard. ``kill_in``: the guard's first watchdog, seconds;
        ``user``: run the job as this user (the agent must be root; see agent/guard.py);
        ``output``: the live log's buffer, fed by the pipe readers.
        Raises :class:`StartFailed` when the process cannot be started."""
        self.timeout_seconds = timeout_seconds
        self._script: Path | None = None
        self._watch: int | None = None
        self._stopped_as: str | None = None
        #: Tags every process of this job (agent/guard.py), so that none outlives it.
        self.cookie = secrets.token_hex(16)
        work_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:  # the job's user works in its directory (agent/cli.py hands it the parent)
            try:
                entry = pwd.getpwnam(user)
                os.chown(work_dir, entry.pw_uid, entry.pw_gid)
            except (KeyError, OSError) as exc:
                raise StartFailed(f"cannot hand the work directory to {user}: {exc}") from exc
        if executor == "shell":
            argv = ["/bin/sh", "-c", command]
        elif executor in INTERPRETERS:
            suffix = ".py" if executor == "python" else ".js"
            fd, name = tempfile.mkstemp(dir=work_dir, prefix="attempt-", suffix=suffix)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(command)
            self._script = Path(name)
            if user is not None:  # the job's user must read its script
                try:
                    entry = pwd.getpwnam(user)
                    os.chown(name, entry.pw_uid, entry.pw_gid)
                except (KeyError, OSError) as exc:
                    self._cleanup()
                    raise StartFailed(f"cannot hand the script to {user}: {exc}") from exc
            argv = [*INTERPRETERS[executor], name]
        else:
            raise StartFailed(f"this agent has no {executor!r} executor")
        if shutil.which(argv[0]) is None:
            self._cleanup()
            raise StartFailed(f"{argv[0]} is not installed on this worker")
        # The guard (agent/guard.py) leads the job's process group and ends it if this agent dies:
        # it watches the read end of a pipe whose write end only this process holds.
        watch_read, self._watch = os.pipe()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    str(GUARD),
                    *(["--kill-in", f"{max(0.0, kill_in):.3f}"] if kill_in is not None else []),
                    *(["--user", user] if user is not None else []),
                    "--",
                    *argv,
                ],
                cwd=work_dir,
                env={**os.environ, **env, COOKIE_VARIABLE: self.cookie},
                stdin=watch_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            self._cleanup()
            raise StartFailed(str(exc)) from exc
        finally:
            os.close(watch_read)
        self.started_monotonic = time.monotonic()
        self.started_wall = time.time()
        assert self.process.stdout is not None and self.process.stderr is not None  # both are pipes
        self._stdout = _Tail(self.process.stdout, sink=(output, "stdout") if output is not None else None)
        self._stderr = _Tail(self.process.stderr, sink=(output, "stderr") if output is not None else None)

    def kill_in(self, seconds: float) -> None:
        """Move the guard's watchdog: end the job group ``seconds`` from now unless moved again.

        Called after every lease renewal, so a job whose agent is paused, hung or cut off stops
        before its lease can lapse. A guard that has already exited is ignored."""
        self._tell_guard(f"{max(0.0, seconds):.3f}")

    def _tell_guard(self, line: str) -> bool:
        """Write one line to the guard's pipe; False if the guard is gone."""
        if self._watch is None:
            return False
        try:
            os.write(self._watch, f"{line}\n".encode("ascii"))
        except OSError:  # BrokenPipeError included: the guard has exited
            return False
        return True

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def handle(self) -> str:
        """The executor handle reported in the running ACK: pid, process group and start time."""
        return f"pid={self.pid} pgid={self.pid} started={self.started_wall:.3f}"

    @property
    def deadline(self) -> float:
        return self.started_monotonic + self.timeout_seconds

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True once the process has exited."""
        try:
            self.process.wait(timeout=max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False

    def signal_stop(self, outcome: str, grace: float = KILL_GRACE_SECONDS) -> None:
        """Start ending the job without waiting: the guard sends SIGTERM to its process group now
        and SIGKILL after ``grace`` (``stop`` then waits for it). Any thread; idempotent."""
        if self.process.poll() is not None:
            return
        if self._stopped_as is None:
            self._stopped_as = outcome
        if not self._tell_guard(f"stop {max(0.0, grace):.3f}"):
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, outcome: str, grace: float = KILL_GRACE_SECONDS) -> None:
        """End the job: SIGTERM to its process group and every other descendant, SIGKILL to
        whatever is left ``grace`` seconds later (default ``KILL_GRACE_SECONDS``). Idempotent. A
        process that already exited keeps its own outcome.

        The guard does it (``stop GRACE`` on its pipe), since only the guard — the job tree's
        subreaper — reaches processes that left the group. Should the guard not answer within
        the grace and ``GUARD_SLACK_SECONDS``, the agent ends the group itself."""
        if self.process.poll() is not None:
            return
        if self._stopped_as is None:
            self._stopped_as = outcome
        if self._tell_guard(f"stop {max(0.0, grace):.3f}") and self.wait(grace + GUARD_SLACK_SECONDS):
            return
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if not self.wait(grace):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait(KILL_GRACE_SECONDS)
        end_processes(None, self.cookie)

    def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until both pipes were read to their end."""
        deadline = time.monotonic() + timeout
        return self._stdout.drained(timeout) and self._stderr.drained(max(0.0, deadline - time.monotonic()))

    def result(self) -> Result:
        """The outcome once the process has exited (call after ``wait`` returned True)."""
        code = self.process.wait()
        # The attempt is over: end anything of the job still running — in its group, or tagged
        # with its cookie should the job have killed its guard (which does this itself otherwise).
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        end_processes(None, self.cookie)
        self._cleanup()
        if self._stopped_as is not None:
            outcome = self._stopped_as
        else:
            outcome = "succeeded" if code == 0 else "failed"
        return Result(outcome, code, self._stdout.text(), self._stderr.text())

    def _cleanup(self) -> None:
        if self._script is not None:
            self._script.unlink(missing_ok=True)
        if self._watch is not None:
            os.close(self._watch)
            self._watch = None
