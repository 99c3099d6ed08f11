"""The job guard: ends a job's whole process group when the agent that started it dies.

    python3 -I agent/guard.py -- ARGV...

The agent starts this file (not the ``agent`` package: only ``os``, ``select``, ``signal`` and
``sys`` are imported, to stay small) as the leader of a new process group, with the read end of
a pipe as its standard input; the agent keeps the write end. The guard runs ARGV as its child in
the same group and waits. Two things can happen:

* the job ends — the guard exits with the job's status (or dies of the job's signal), so the
  agent sees exactly what the job did;
* the pipe reports end-of-file — the agent died (even by SIGKILL: the kernel closes its end), so
  nothing holds a lease for this job any more and it must not run on: the guard sends SIGTERM to
  the whole group, then SIGKILL after ``GRACE_SECONDS``. Without it a killed agent's job would
  run on unsupervised while the control plane, seeing the attempt lost, retries it elsewhere.

SIGTERM sent to the group by the agent (timeout, cancellation) reaches the job; the guard itself
ignores it and reports how the job ended. A job that leaves the group on purpose (``setsid``)
is beyond any guard's reach.
"""

import os
import select
import signal
import sys

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


def _end_group(child: int) -> None:
    os.killpg(0, signal.SIGTERM)
    waited = 0.0
    while waited < GRACE_SECONDS:
        done, _ = os.waitpid(child, os.WNOHANG)
        if done:
            break
        select.select([], [], [], 0.1)
        waited += 0.1
    os.killpg(0, signal.SIGKILL)  # whatever is left of the group, the guard included


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "--" or len(argv) < 2:
        sys.stderr.write("usage: guard.py -- ARGV...\n")
        os._exit(2)
    command = argv[1:]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the job decides how a group SIGTERM ends it
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(f"cannot start {command[0]}: {exc}\n")
            os._exit(127)
    watching = True
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            _exit_like(status)
        if watching:
            readable, _, _ = select.select([0], [], [], POLL_SECONDS)
            if readable and not os.read(0, 4096):
                _end_group(child)
                watching = False
        else:
            select.select([], [], [], POLL_SECONDS)


if __name__ == "__main__":
    main(sys.argv[1:])
