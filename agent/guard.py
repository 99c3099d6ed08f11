"""The job guard: a job never outlives the lease that authorises it, nor the agent that holds it.

    python3 -I agent/guard.py [--kill-in SECONDS] -- ARGV...

The agent starts this file (not the ``agent`` package: only ``os``, ``select``, ``signal``,
``sys``, ``time`` and, on Linux, ``ctypes`` are imported, to stay small) as the leader of a new
process group, with the read end of a pipe as its standard input; only the agent holds the write
end. The guard runs ARGV as its child in the same group and waits for one of four things:

* the job ends — the guard ends whatever the job left running (below) and exits with the job's
  status (or dies of the job's signal), so the agent sees exactly what the job did;
* the pipe reaches end-of-file — the agent died (even by SIGKILL: the kernel closes its end);
* the watchdog runs out — the agent did not move it in time. The agent writes a line with a
  number of seconds after every lease renewal ("end the job this long from now"); ``--kill-in``
  sets the first. An agent that is paused, hung or cut off from the control plane cannot renew,
  so its job is ended shortly before the lease could lapse;
* the agent writes ``stop GRACE`` — it stops the job (cancellation, timeout, shutdown).

In the last three cases the guard *ends the job*: SIGTERM to the whole group and to every other
descendant, then, once the job has exited or GRACE seconds (``GRACE_SECONDS`` for the agent's
death and the watchdog) have passed, SIGKILL to every descendant left. The guard ignores SIGTERM
itself and exits the way the job did.

**The whole tree, not just the group.** A job may leave the process group on purpose (``setsid``,
a daemonising double fork). On Linux the guard is a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``): every process of the job's tree whose parent exits is
re-parented to the guard instead of to init, so the guard finds all of them by walking
``/proc/<pid>/stat`` parent links from itself, whatever their group or session, and reaps them.
Out of reach is only a process another subreaper adopts or one moved away by a privileged call;
where ``/proc`` or ``prctl`` is missing, the guard falls back to the process group.
"""

import os
import select
import signal
import sys
import time

GRACE_SECONDS = 2.0
POLL_SECONDS = 0.5
#: How long the guard waits for SIGKILLed processes to die before giving up on them.
KILL_WAIT_SECONDS = 5.0
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


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


def _become_subreaper() -> bool:
    """Adopt the job tree's orphans (Linux); False where the kernel offers no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _descendants() -> list[int] | None:
    """Live descendants of the guard, found through ``/proc`` parent links (zombies left out);
    None where ``/proc`` cannot be read."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    children: dict[int, list[int]] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
            # "pid (comm) state ppid …": comm may hold spaces and parentheses; split after the last ")"
            state, ppid = stat[stat.rindex(b")") + 1:].split()[:2]
        except (OSError, ValueError):
            continue
        if state not in (b"Z", b"X"):
            children.setdefault(int(ppid), []).append(int(name))
    found, todo = [], [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def _signal_tree(signum: int) -> bool:
    """Send ``signum`` to every live descendant; False when none was left (or ``/proc`` is
    missing)."""
    pids = _descendants() or []
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass
    return bool(pids)


class _Job:
    """The job (the guard's child) and the reaping of everything re-parented to the guard."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status: int | None = None

    def reap(self) -> bool:
        """Reap every exited child; True once the job itself has exited."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self.pid:
                self.status = status
        return self.status is not None

    def finish(self) -> None:
        """SIGKILL whatever the job left running, then exit the way the job did."""
        if _descendants() is None:  # no /proc: the process group is all the guard can reach
            if self.status is None:
                os.killpg(0, signal.SIGKILL)  # the job lives on: end the group, the guard included
            _exit_like(self.status)
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while True:
            left = _signal_tree(signal.SIGKILL)
            if (self.reap() and not left) or time.monotonic() >= deadline:
                break
            select.select([], [], [], 0.01)
        _exit_like(self.status if self.status is not None else signal.SIGKILL)

    def end(self, why: str, grace: float) -> None:
        """End the job: SIGTERM to the group and the whole tree, SIGKILL after ``grace`` s."""
        _say(f"qinglong guard: {why}; ending the job\n")
        try:
            os.killpg(0, signal.SIGTERM)  # the guard ignores it
        except OSError:
            pass
        _signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not self.reap() and time.monotonic() < deadline:
            select.select([], [], [], 0.05)
        self.finish()


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
    _become_subreaper()
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
    job = _Job(child)
    pending = b""
    while True:
        if job.reap():
            job.finish()
        wait = POLL_SECONDS if deadline is None else max(0.0, min(POLL_SECONDS, deadline - time.monotonic()))
        readable, _, _ = select.select([0], [], [], wait)
        if readable:
            data = os.read(0, 4096)
            if not data:
                job.end("the agent is gone", GRACE_SECONDS)
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    if line.startswith(b"stop "):
                        job.end("stopped by the agent", float(line[5:]))
                    deadline = time.monotonic() + float(line)
                except ValueError:  # not from our agent; never let it end the guard
                    continue
        if deadline is not None and time.monotonic() >= deadline:
            job.end("the lease was not renewed in time", GRACE_SECONDS)


if __name__ == "__main__":
    main(sys.argv[1:])
