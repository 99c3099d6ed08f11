"""The job guard ends the job's whole tree — processes that left the process group (``setsid``,
a daemonising double fork) included — whenever the job must stop: the agent stops it, the agent
dies, the watchdog runs out, or the job itself ended and left something behind (agent/guard.py).
Real processes, no mocks."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent.executor import Execution
from agent.guard import _tree, job_processes
from tests.agent.processes import ROOT, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")

#: A job that starts a process in a session of its own — whose parent then exits, so it is an
#: orphan outside the job's process group — and then runs on (or not) itself. The job goes on only
#: once the escapee has written its pid: a job that ended first (``exit 3``) had its leftover
#: ended by the guard before it wrote it — on a busy machine, often (a 10 s wait for nothing).
ESCAPE = (
    "(setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' &); "
    "while [ ! -s {pidfile} ]; do sleep 0.01; done; {then}"
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in (b"Z", b"X")


def start(tmp_path: Path, then: str, **kwargs) -> tuple[Execution, int]:
    pidfile = tmp_path / "escaped.pid"
    execution = Execution(
        executor="shell",
        command=ESCAPE.format(pidfile=pidfile, then=then),
        env={},
        timeout_seconds=600,
        work_dir=tmp_path / "work",
        **kwargs,
    )
    escaped = wait_for(
        lambda: pidfile.exists() and pidfile.read_text().strip(),
        timeout=10,
        what="the escapee's pid",
        step=0.02,
    )
    pid = int(escaped)
    assert os.getpgid(pid) != execution.pid and os.getsid(pid) != os.getsid(execution.pid)  # it left
    return execution, pid


def test_stopping_the_job_ends_a_process_that_left_the_group(tmp_path):
    execution, escaped = start(tmp_path, "trap '' TERM; sleep 300 & wait")  # the job ignores SIGTERM
    started = time.monotonic()
    execution.stop("cancelled", grace=0.5)
    assert execution.wait(0)
    assert time.monotonic() - started < 2.5
    assert execution.result().outcome == "cancelled"
    wait_for(lambda: not alive(escaped), timeout=2, what="the escaped process to die", step=0.02)


def test_the_agents_death_ends_a_process_that_left_the_group(tmp_path):
    execution, escaped = start(tmp_path, "sleep 300")
    os.close(execution._watch)  # what the kernel does to the pipe when the agent dies
    execution._watch = None
    assert execution.wait(5)
    wait_for(lambda: not alive(escaped), timeout=2, what="the escaped process to die", step=0.02)


def test_the_watchdog_ends_a_process_that_left_the_group(tmp_path):
    execution, escaped = start(tmp_path, "sleep 300", kill_in=30)
    execution.kill_in(0.2)  # the lease was not renewed: the guard ends the job on its own
    assert execution.wait(5)
    wait_for(lambda: not alive(escaped), timeout=2, what="the escaped process to die", step=0.02)


def test_what_a_finished_job_leaves_behind_is_ended_and_its_status_kept(tmp_path):
    execution, escaped = start(tmp_path, "exit 3")
    assert execution.wait(5)
    result = execution.result()
    assert (result.outcome, result.exit_code) == ("failed", 3)
    wait_for(lambda: not alive(escaped), timeout=2, what="the leftover process to die", step=0.02)


def test_a_job_that_kills_its_guard_leaves_nothing_behind(tmp_path):
    """The job kills the guard (its parent) after starting a process of its own session: the
    agent ends every process tagged with the job's cookie once the guard is gone."""
    execution, escaped = start(tmp_path, "kill -9 $PPID; sleep 300")
    assert execution.wait(5)
    execution.result()
    wait_for(lambda: not alive(escaped), timeout=2, what="the escaped process to die", step=0.02)
    assert job_processes(None, execution.cookie) == []


HOPPER = r"""
import os, sys, time
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if os.fork():
        os._exit(0)          # the parent leaves: the process of the job keeps changing its pid
    os.setsid()
    with open(sys.argv[1], "w") as beat:
        beat.write(str(time.monotonic()))
    time.sleep(0.005)
"""


def test_a_process_that_keeps_changing_its_pid_is_caught(tmp_path):
    beat = tmp_path / "beat"
    execution = Execution(
        executor="python",
        command=HOPPER.replace("sys.argv[1]", repr(str(beat))),
        env={},
        timeout_seconds=600,
        work_dir=tmp_path / "work",
    )
    wait_for(beat.exists, timeout=10, what="the hopper to run")
    time.sleep(0.5)
    execution.stop("cancelled", grace=0.2)
    execution.result()
    assert job_processes(None, execution.cookie) == []
    last = beat.read_text()
    time.sleep(0.3)
    assert beat.read_text() == last  # nobody is hopping any more


AGENT = r"""
import sys, time
from pathlib import Path
from agent.executor import Execution
from agent.guard import _tree, job_processes
execution = Execution(executor="shell", command=sys.argv[1], env={}, timeout_seconds=600,
                      work_dir=Path(sys.argv[2]))
print(execution.pid, execution.cookie, flush=True)
time.sleep(600)
"""


def test_the_agents_death_is_seen_even_when_the_job_holds_the_guards_pipe(tmp_path):
    """The job opens the guard's watchdog pipe for writing (through /proc, as root can) and keeps
    pushing the watchdog out: the guard still sees the agent die (it is re-parented)."""
    job = "exec 3>/proc/$PPID/fd/0; while true; do echo 100000 >&3; sleep 0.2; done"
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, job, str(tmp_path / "work")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        guard, cookie = agent.stdout.readline().split()
        wait_for(lambda: len(job_processes(int(guard), cookie) or []) >= 2, timeout=10, what="the job to run")
        time.sleep(0.5)
        agent.kill()
        agent.wait(5)
        wait_for(
            lambda: not alive(int(guard)) and not job_processes(None, cookie),
            timeout=5,
            step=0.05,
            what="the guard and the job to end",
        )
    finally:
        agent.kill()
        agent.wait(5)


def _job_user() -> str | None:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return None
    return "nobody" if os.geteuid() == 0 else None


@pytest.mark.skipif(_job_user() is None, reason="needs root and the user nobody")
def test_a_job_run_as_another_user_cannot_stop_or_kill_its_guard(request):
    """With ``--job-user`` the job runs as another user: its attempts to stop and to kill its
    guard fail (EPERM), and the guard still ends it and its escapee when told to."""
    work = Path(tempfile.mkdtemp(prefix="qinglong-job-user-"))  # pytest's tmp_path is private to root
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    nobody = pwd.getpwnam("nobody")
    os.chown(work, nobody.pw_uid, nobody.pw_gid)
    pidfile = work / "escaped.pid"
    report = work / "report"
    command = f"id -u > {report}; kill -STOP $PPID 2>>{report}; kill -9 $PPID 2>>{report}; " + ESCAPE.format(
        pidfile=pidfile, then="sleep 300"
    )
    execution = Execution(
        executor="shell", command=command, env={}, timeout_seconds=600, work_dir=work, user="nobody"
    )
    escaped = int(
        wait_for(
            lambda: pidfile.exists() and pidfile.read_text().strip(),
            timeout=10,
            what="the escapee's pid",
            step=0.02,
        )
    )
    assert report.read_text().splitlines()[0] == str(nobody.pw_uid)
    assert alive(execution.pid)  # the guard survived both signals
    execution.stop("cancelled", grace=0.5)
    assert execution.wait(5) and execution.result().outcome == "cancelled"
    wait_for(lambda: not alive(escaped), timeout=2, what="the escaped process to die", step=0.02)


#: A process that starts a child and then keeps starting threads that end at once, so its
#: ``/proc/<pid>/task`` listing keeps naming threads that are gone by the time they are read.
CHURN = (
    "import subprocess, sys, threading\n"
    "child = subprocess.Popen(['sleep', '300'])\n"
    "print(child.pid, flush=True)\n"
    "while True:\n"
    "    threads = [threading.Thread(target=int) for _ in range(8)]\n"
    "    [thread.start() for thread in threads]\n"
    "    [thread.join() for thread in threads]\n"
)


def test_the_tree_walk_finds_the_children_of_a_process_whose_threads_come_and_go():
    # A thread ending between the task listing and the read of its children file used to read as
    # "this kernel has no children files": the walk gave up and the freeze froze nobody.
    churner = subprocess.Popen([sys.executable, "-c", CHURN], stdout=subprocess.PIPE, text=True)
    child = int(churner.stdout.readline())
    try:
        walks = [_tree(churner.pid) for _ in range(3000)]
        assert all(walk == {child} for walk in walks), {repr(walk) for walk in walks if walk != {child}}
    finally:
        churner.kill()
        churner.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)
