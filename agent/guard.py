"""The job guard: a job never outlives the lease that authorises it, nor the agent that holds it.

    python3 -I agent/guard.py [--kill-in SECONDS] [--user NAME] -- ARGV...

The agent starts this file (not the ``agent`` package: only ``os``, ``pwd``, ``select``,
``signal``, ``sys``, ``time`` and, on Linux, ``ctypes`` are imported, to stay small; the agent
imports its :func:`end_processes`) as the leader of a new process group, with the read end of a pipe as its
standard input; only the agent holds the write end. The guard runs ARGV as its child in the same
group (as ``--user``, if given) and waits for one of four things:

* the job ends — the guard ends whatever the job left running (below) and exits with the job's
  status (or dies of the job's signal), so the agent sees exactly what the job did;
* the agent dies — even by SIGKILL: the pipe reaches end-of-file (the kernel closes the agent's
  end), or the guard finds itself re-parented (checked every poll, so a job that got hold of the
  pipe cannot hide the agent's death);
* the watchdog runs out — the agent did not move it in time. The agent writes a line with a
  number of seconds after every lease renewal ("end the job this long from now"); ``--kill-in``
  sets the first. An agent that is paused, hung or cut off from the control plane cannot renew,
  so its job is ended shortly before the lease could lapse;
* the agent writes ``stop GRACE`` — it stops the job (cancellation, timeout, shutdown).

In the last three cases the guard *ends the job*: SIGTERM to the whole group and to every other
process of the job, then, once the job has exited or GRACE seconds (``GRACE_SECONDS`` for the
agent's death and the watchdog) have passed, SIGKILL to every process of the job left — frozen
with SIGSTOP first, so that a fork storm or a process that keeps changing its pid cannot slip
through (:func:`end_processes`). The guard ignores SIGTERM itself and exits the way the job did.

**The processes of a job, not just its group.** A job may leave the process group on purpose
(``setsid``, a daemonising double fork). On Linux the guard is a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``): every process of the job's tree whose parent exits is
re-parented to the guard instead of to init, so the guard finds them all by walking its tree
(``/proc/<pid>/task/<tid>/children``, quick enough to freeze a process that keeps changing its pid
even on a busy machine, then ``/proc/<pid>/stat`` parent links), and reaps them. The agent also
tags the job's environment with a per-job cookie (``QINGLONG_JOB_COOKIE``), which every process of
the job inherits wherever it goes; the guard — and the agent, after the guard has exited, in case
the job killed its guard — also ends every process that carries it (the technique of Jenkins'
process tree killer). The guard is not dumpable, so a job running as the same (non-root) user
cannot open the guard's pipe through ``/proc``.

**A job of the agent's own user can still stop or kill the guard (and the agent) on purpose** —
any process may signal another of the same user. ``--user NAME`` (the agent's ``--job-user``;
the agent runs as root) runs the job as another user, which closes that: the job cannot signal,
stop or inspect the guard or the agent, nor leave the reach of the guard, which still signals
the job as root. Without it, the guarantee covers jobs that misbehave by accident (ignore
SIGTERM, daemonise, fork storms, leftovers), not a job written to escape.
"""

from __future__ import annotations

import os
import pwd
import select
import signal
import sys
import time

TYPE_CHECKING = False  # typing is not imported at run time: the guard stays small
if TYPE_CHECKING:
    from collections.abc import Callable

GRACE_SECONDS = 2.0
POLL_SECONDS = 0.5
#: How long the guard waits for SIGKILLed processes to die before giving up on them.
KILL_WAIT_SECONDS = 5.0
PR_SET_DUMPABLE = 4  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
#: The environment variable that tags every process of one job (set by the agent, inherited by
#: the job's processes wherever they go, unless they clear their environment).
COOKIE_VARIABLE = "QINGLONG_JOB_COOKIE"


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


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False where it is not available or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # Imported here, not at the top: the agent imports this module too (end_processes) and
        # must not load ctypes; only the guard process calls prctl.
        import ctypes  # noqa: PLC0415

        return bool(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _proc_entries() -> list[tuple[int, int, bytes]] | None:
    """``(pid, ppid, state)`` of every process in ``/proc``; None where it cannot be read."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    entries = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
            # "pid (comm) state ppid …": comm may hold spaces and parentheses; split after the last ")"
            state, ppid = stat[stat.rindex(b")") + 1 :].split()[:2]
        except (OSError, ValueError):
            continue
        entries.append((int(name), int(ppid), state))
    return entries


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:  # gone, or another user's process
        return False


def _tree(root: int) -> set[int] | None:
    """The descendants of ``root`` through ``/proc/<pid>/task/<tid>/children``: one small read per
    process of the tree, fast enough to catch a process that keeps changing its pid (a full
    ``/proc`` scan on a busy machine takes longer than such a process lives). None where the
    kernel offers no ``children`` files."""
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            if pid == root:
                return None
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                    kids = handle.read().split()
            except FileNotFoundError:
                if pid == root and os.path.isdir(f"/proc/{pid}/task/{tid}"):
                    return None  # the thread is there, its children file is not: no such files
                continue  # the thread (or the process) ended between the listing and the read
            except OSError:
                continue
            for kid in map(int, kids):
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def _freeze_tree(root: int, deadline: float) -> set[int]:
    """SIGSTOP the descendants of ``root`` (:func:`_tree`) until a walk finds nobody new; the
    processes frozen. A stopped process cannot fork, and the guard is the job's subreaper, so a
    process of the tree that keeps changing its pid stays in the tree and is caught here."""
    frozen: set[int] = set()
    while time.monotonic() < deadline:
        tree = _tree(root)
        if not tree or tree <= frozen:
            break
        for pid in tree - frozen:
            _signal(pid, signal.SIGSTOP)
        frozen |= tree
    return frozen


def job_processes(root: int | None, cookie: str | None) -> list[int] | None:
    """Live (non-zombie) processes of a job: the descendants of ``root`` through ``/proc`` parent
    links, and every process whose environment carries ``QINGLONG_JOB_COOKIE=cookie`` (which the
    job's processes inherit even after leaving the tree, unless they clear their environment).
    The calling process is never included. None where ``/proc`` cannot be read."""
    entries = _proc_entries()
    if entries is None:
        return None
    me = os.getpid()
    children: dict[int, list[int]] = {}
    live = set()
    for pid, ppid, state in entries:
        if state not in (b"Z", b"X") and pid != me:
            children.setdefault(ppid, []).append(pid)
            live.add(pid)
    found: set[int] = set()
    todo = [root] if root is not None else []
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    if cookie:
        marker = f"{COOKIE_VARIABLE}={cookie}".encode()
        found.update(pid for pid in live - found if _carries(pid, marker))
    return sorted(found)


def end_processes(
    root: int | None,
    cookie: str | None,
    *,
    timeout: float = KILL_WAIT_SECONDS,
    reap: Callable[[], object] | None = None,
) -> bool:
    """SIGKILL every process of a job (:func:`job_processes`) until none is left.

    Freeze, then kill: each round first freezes ``root``'s tree through its ``children`` files
    (:func:`_freeze_tree`, fast), then sends SIGSTOP to every process a full scan finds and scans
    again until a scan finds nothing new — a stopped process cannot fork, so a fork storm or a
    process that keeps changing its pid is caught — then SIGKILL to all of them. ``reap``
    (optional) is called between rounds to collect zombies. Returns True once none is left,
    False after ``timeout`` seconds or where ``/proc`` cannot be read."""
    deadline = time.monotonic() + timeout
    while True:
        frozen = _freeze_tree(root, deadline) if root is not None else set()
        found = job_processes(root, cookie)
        if found is None:
            return False
        if not found and not frozen:
            return True
        pids = sorted(set(found) | frozen)
        while pids and not set(pids) <= frozen and time.monotonic() < deadline:
            for pid in set(pids) - frozen:
                _signal(pid, signal.SIGSTOP)
            frozen.update(pids)
            pids = job_processes(root, cookie) or []
        for pid in frozen | set(pids):
            _signal(pid, signal.SIGKILL)
        if reap is not None:
            reap()
        if time.monotonic() >= deadline:
            return not job_processes(root, cookie)
        select.select([], [], [], 0.01)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


class _Job:
    """The job (the guard's child) and the reaping of everything re-parented to the guard."""

    def __init__(self, pid: int, cookie: str | None) -> None:
        self.pid = pid
        self.cookie = cookie
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
        """SIGKILL whatever of the job is left (frozen first), then exit the way the job did."""
        if not os.path.isdir("/proc/self"):  # no /proc: the process group is all the guard can reach
            if self.status is None:
                os.killpg(0, signal.SIGKILL)  # the job lives on: end the group, the guard included
            _exit_like(self.status if self.status is not None else signal.SIGKILL)
        end_processes(os.getpid(), self.cookie, reap=self.reap)
        deadline = time.monotonic() + 1.0
        while not self.reap() and time.monotonic() < deadline:
            select.select([], [], [], 0.01)
        _exit_like(self.status if self.status is not None else signal.SIGKILL)

    def end(self, why: str, grace: float) -> None:
        """End the job: SIGTERM to the group and every other process of the job, SIGKILL to
        whatever is left once the job has exited or ``grace`` seconds have passed."""
        _say(f"qinglong guard: {why}; ending the job\n")
        try:
            os.killpg(0, signal.SIGTERM)  # the guard ignores it
        except OSError:
            pass
        for pid in job_processes(os.getpid(), self.cookie) or []:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not self.reap() and time.monotonic() < deadline:
            select.select([], [], [], 0.05)
        self.finish()


def _parse(argv: list[str]) -> tuple[float | None, str | None, list[str]]:
    kill_in = user = None
    while argv[:1] in (["--kill-in"], ["--user"]) and len(argv) >= 2:
        if argv[0] == "--kill-in":
            kill_in = float(argv[1])
        else:
            user = argv[1]
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        _say("usage: guard.py [--kill-in SECONDS] [--user NAME] -- ARGV...\n")
        os._exit(2)
    return kill_in, user, argv[1:]


def _become(user: str) -> None:
    """In the job's process, before exec: drop to ``user`` (its groups, gid, uid, HOME). A job of
    another user cannot signal, stop or inspect the guard or the agent."""
    entry = pwd.getpwnam(user)
    os.initgroups(user, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)


def main(argv: list[str]) -> None:
    kill_in, user, command = _parse(argv)
    deadline = None if kill_in is None else time.monotonic() + kill_in
    agent = os.getppid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the job decides how a group SIGTERM ends it
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # the job tree's orphans come to the guard, not to init
    _prctl(PR_SET_DUMPABLE, 0)  # the job (another uid-equal process) cannot open the guard's fds
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        try:
            if user is not None:
                _become(user)
        except (KeyError, OSError) as exc:
            _say(f"cannot run the job as {user}: {exc}\n")
            os._exit(126)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            _say(f"cannot start {command[0]}: {exc}\n")
            os._exit(127)
    job = _Job(child, os.environ.get(COOKIE_VARIABLE))
    pending = b""
    while True:
        if job.reap():
            job.finish()
        if os.getppid() != agent:  # re-parented: the agent died, whoever holds the pipe
            job.end("the agent is gone", GRACE_SECONDS)
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
