"""The acceptance tests of live job output (issue 14) with a real agent and real servers:

* a job printing 100,000 lines over 20 s on both streams is followed through ``GET …/log?after=``
  while it runs, and afterwards the stored log is byte-for-byte what the job wrote;
* the control plane stopped for 30 s while a job prints: the agent's memory stays bounded, the
  job is not slowed, and the log shows the lines or an explicit gap marker.

These are the two long tests of the log transport (about 30 s and 60 s per leg).
"""

from __future__ import annotations

import os
import re
import time
import urllib.request

import psutil
import pytest

from actions.enrollment import enrollment_token_create, worker_create
from actions.logs import sweep_log_compaction
from logs.models import AttemptLog
from logs.selectors import read_log
from runs.models import Run, RunAttempt
from tests.agent.processes import Agent, ControlPlane, wait_for
from tests.helpers import enqueue, make_revision, operator_headers
from tests.logs.jobs import expected, job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUN_ARGS = ("run", "--poll-max", "1", "--backoff-max", "1", "--timeout", "5", "--drain-timeout", "10")
MARKER = re.compile(rb"^\[qinglong\] gap: .*$")


def finished(run) -> Run | None:
    run = Run.objects.get(pk=run.pk)
    return run if run.state in ("succeeded", "failed", "timed_out", "cancelled") else None


def read(url: str, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read(), dict(answer.headers)


def enroll(agent: Agent, url: str, name: str) -> None:
    worker = worker_create(name=name)
    token = enrollment_token_create(worker_id=worker.pk).token
    assert agent.start("enroll", "--server", url, "--token", token).wait(30) == 0, agent.log()


def test_a_live_log_is_followed_while_it_runs_and_stored_byte_for_byte(live_server, tmp_path):
    lines, seconds = 100_000, 20.0
    stamp = tmp_path / "duration"
    agent = Agent(tmp_path / "state", tmp_path)
    headers = operator_headers("log-reader", role="viewer")
    try:
        enroll(agent, live_server.url, f"logs-{os.getpid()}")
        run = enqueue(
            make_revision(executor="python", command=job(lines, seconds, str(stamp)), timeout_seconds=300)
        )
        agent.start(*RUN_ARGS)
        followed, reads_while_running, offset = b"", 0, 0
        wait_for(lambda: RunAttempt.objects.filter(run=run, state="running").exists(), what="the job to run")
        deadline = time.monotonic() + seconds * 6
        while time.monotonic() < deadline:
            data, answer = read(f"{live_server.url}/api/v1/ops/runs/{run.pk}/log?after={offset}", headers)
            followed += data
            assert int(answer["X-Log-Next-Offset"]) == offset + len(data)
            offset = int(answer["X-Log-Next-Offset"])
            if answer["X-Log-Complete"] == "true":
                if not data:
                    break
                continue
            if data:
                reads_while_running += 1
            time.sleep(0.5)
        assert finished(run) is not None, agent.log()[-3000:]
        assert reads_while_running >= 5, reads_while_running  # the log grew while the job ran
        assert Run.objects.get(pk=run.pk).state == "succeeded"

        out, err = expected(lines)
        attempt = RunAttempt.objects.get(run=run)
        assert read_log(attempt, stream="stdout", limit=1 << 30).data == out
        assert read_log(attempt, stream="stderr", limit=1 << 30).data == err
        stored = read_log(attempt, limit=1 << 30).data
        assert followed == stored and len(stored) == len(out) + len(err)
        assert sweep_log_compaction() == 1 or AttemptLog.objects.get(pk=attempt.pk).compacted_at
        assert read_log(attempt, stream="stdout", limit=1 << 30).data == out
        assert read_log(attempt, stream="stderr", limit=1 << 30).data == err
        assert float(stamp.read_text()) < seconds * 1.5
    finally:
        agent.kill()


@pytest.mark.sqlite  # what it proves is the agent's (bounded buffer, job not slowed): one store
def test_the_control_plane_away_for_30_s_bounds_the_agent_and_does_not_slow_the_job(tmp_path):
    lines, seconds, outage = 240_000, 50.0, 30.0
    stamp = tmp_path / "duration"
    plane = ControlPlane(
        tmp_path,
        QINGLONG_RUN_LEASE_SECONDS="120",
        QINGLONG_SESSION_LEASE_SECONDS="120",
        QINGLONG_HEARTBEAT_INTERVAL_SECONDS="5",
        QINGLONG_OUTPUT_DIR=str(tmp_path / "output"),
    )
    plane.start()
    agent = Agent(tmp_path / "state", tmp_path)
    try:
        enroll(agent, plane.url, f"outage-{os.getpid()}")
        run = enqueue(
            make_revision(executor="python", command=job(lines, seconds, str(stamp)), timeout_seconds=600)
        )
        process = agent.start(*RUN_ARGS)
        attempt = wait_for(
            lambda: RunAttempt.objects.filter(run=run, state="running").first(),
            what="the job to run",
            timeout=60,
        )
        wait_for(
            lambda: AttemptLog.objects.filter(pk=attempt.pk, stored_bytes__gt=0).exists(), what="first chunks"
        )
        agent_process = psutil.Process(process.pid)
        before = agent_process.memory_info().rss
        plane.stop()
        peak, stopped = before, time.monotonic()
        while time.monotonic() - stopped < outage:
            peak = max(peak, agent_process.memory_info().rss)
            time.sleep(0.5)
        plane.start()
        done = wait_for(lambda: finished(run), what="the run to end", timeout=seconds * 4)
        assert done.state == "succeeded", agent.log()[-3000:]
        # The job wrote about 4 MiB more while the control plane was away than the agent buffers (1 MiB).
        assert peak - before < 24 * 1024 * 1024, (before, peak)
        assert float(stamp.read_text()) < seconds + 10, "the job was slowed"

        out, _ = expected(lines)
        stored = read_log(RunAttempt.objects.get(pk=attempt.pk), stream="stdout", limit=1 << 30).data
        wanted = out.splitlines(keepends=True)
        got = stored.splitlines(keepends=True)
        markers = [line for line in got if MARKER.match(line.rstrip(b"\n"))]
        lines_kept = [line for line in got if not MARKER.match(line.rstrip(b"\n"))]
        assert markers, "the outage outlasted the buffer: a gap marker must say so"
        assert lines_kept[0] == wanted[0] and lines_kept[-1] == wanted[-1]
        positions = {line: index for index, line in enumerate(wanted)}
        indexes = [positions[line] for line in lines_kept if line in positions]
        partial = [line for line in lines_kept if line not in positions]
        assert len(partial) <= 2 * len(markers)  # a line cut by a drop, at most at each gap's edges
        assert indexes == sorted(indexes)
        assert len(indexes) < len(wanted)
    finally:
        plane.stop()
        agent.kill()
