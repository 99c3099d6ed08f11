"""The job guard: a job never outlives the lease that authorises it, nor the agent that holds it.

    python3 -I agent/guard.py [--kill-in SECONDS] -- ARGV...

The agent starts this file (not the ``agent`` package: only ``os``, ``select``, ``signal`` and
``sys`` are imported, to stay small) as the leader of a new process group, with the read end of
a pipe as its standard input; only the agent holds the write end. The guard runs ARGV as its
child in the same group and waits for one of three things:

* the job ends — the guard exits with the job's status (or dies of the job's signal), so the
  agent sees exactly what the job did;
* the pipe reaches end-of-file — the agent died (even by SIGKILL: the kernel closes its end);
* the watchdog runs out — the agent did not move it in time. The agent writes a line with a
  number of seconds after every lease renewal ("end the job this long from now"); ``--kill-in``
  sets the first. An agent that is paused, hung or cut off from the control plane cannot renew,
  so its job is ended shortly before the lease could lapse.

In the last two cases nothing holds a valid lease for the job any more and it must not run on
(the control plane will see the attempt lost and may run it again): the guard sends SIGTERM to
the whole group, then SIGKILL after ``GRACE_SECONDS``. SIGTERM sent to the group by the agent
(timeout, cancellation) reaches the job; the guard itself ignores it and reports how the job
ended. A job that leaves the group on purpose (``setsid``) is beyond any guard's reach.
"""

import os
import select
import signal
import sys
import time

GRACE_SECONDS = 2.0
POLL_SECONDS = 0.5


def _exit_like(status: int) -> None:
    """Exit the way the job did: with its exit code, or by the signal that ended it."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # only if that signal did not end us
    os._exit(os.WEXITSTATUS(status))


def _say(text: str) -> None:
    """A line on the job's stderr, if anyone still reads it (a dead agent does not: EPIPE)."""
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def _end_group(child: int, why: str) -> None:
    _say(f"qinglong guard: {why}; ending the job\n")
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        done, _ = os.waitpid(child, os.WNOHANG)
        if done:
            break
        select.select([], [], [], 0.05)
    os.killpg(0, signal.SIGKILL)  # whatever is left of the group, the guard included


def _parse(argv: list[str]) -> tuple[float | None, list[str]]:
    kill_in = None
    if argv[:1] == ["--kill-in"] and len(argv) >= 2:
        kill_in = float(argv[1])
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        _say("usage: guard.py [--kill-in SECONDS] -- ARGV...\n")
        os._exit(2)
    return kill_in, argv[1:]


def main(argv: list[str]) -> None:
    kill_in, command = _parse(argv)
    deadline = None if kill_in is None else time.monotonic() + kill_in
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the job decides how a group SIGTERM ends it
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            _say(f"cannot start {command[0]}: {exc}\n")
            os._exit(127)
    pending = b""
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            _exit_like(status)
        wait = POLL_SECONDS if deadline is None else max(0.0, min(POLL_SECONDS, deadline - time.monotonic()))
        readable, _, _ = select.select([0], [], [], wait)
        if readable:
            data = os.read(0, 4096)
            if not data:
                _end_group(child, "the agent is gone")
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines[-1:]:
                deadline = time.monotonic() + float(line)
        if deadline is not None and time.monotonic() >= deadline:
            _end_group(child, "the lease was not renewed in time")


if __name__ == "__main__":
    main(sys.argv[1:])
