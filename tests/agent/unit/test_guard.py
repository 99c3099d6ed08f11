"""The job guard ends the job's whole tree — processes that left the process group (``setsid``,
a daemonising double fork) included — whenever the job must stop: the agent stops it, the agent
dies, the watchdog runs out, or the job itself ended and left something behind (agent/guard.py).
Real processes, no mocks."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from agent.executor import Execution
from tests.agent.processes import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")

#: A job that starts a process in a session of its own — whose parent then exits, so it is an
#: orphan outside the job's process group — and then runs on (or not) itself.
ESCAPE = "(setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' &); {then}"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in (b"Z", b"X")


def start(tmp_path: Path, then: str, **kwargs) -> tuple[Execution, int]:
    pidfile = tmp_path / "escaped.pid"
    execution = Execution(executor="shell", command=ESCAPE.format(pidfile=pidfile, then=then), env={},
                          timeout_seconds=600, work_dir=tmp_path / "work", **kwargs)
    escaped = wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=10, what="the escapee's pid", step=0.02)
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
