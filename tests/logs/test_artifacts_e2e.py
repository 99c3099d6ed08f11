"""An artifact round trip with a real agent (issue 14): the job writes files in its work directory,
the agent collects those matching the revision's declared globs after the job ends, uploads them
under the same lease with their SHA-256 before completing, and an operator downloads the same
bytes. A file over the declared per-file limit is left out by the agent (and would be refused by
the server, tests/logs/test_artifacts.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from logs.models import Artifact
from runs.models import Run
from runs.revisions import OutputSpec
from tests.agent.processes import Agent, wait_for
from tests.helpers import enqueue, make_revision, operator_headers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOB = (
    "mkdir -p out && seq 1 40000 > out/data.bin && echo report > out/report.txt "
    "&& head -c 300000 /dev/zero > out/too-big.bin && echo not-declared > other.txt && echo done"
)


def test_declared_files_are_uploaded_checksummed_and_downloadable(live_server, tmp_path, client):
    agent = Agent(tmp_path / "state", tmp_path)
    work = tmp_path / "work"
    try:
        worker = worker_create(name=f"artifacts-{os.getpid()}")
        token = enrollment_token_create(worker_id=worker.pk).token
        assert agent.start("enroll", "--server", live_server.url, "--token", token).wait(30) == 0, agent.log()
        spec = OutputSpec(paths=("out/*",), max_files=8, max_file_bytes=250_000, max_total_bytes=1_000_000)
        run = enqueue(make_revision(command=JOB, output=spec))
        agent.start("run", "--poll-max", "1", "--work-dir", str(work))
        done = wait_for(
            lambda: Run.objects.filter(pk=run.pk, state__in=("succeeded", "failed")).first(),
            what="the run to end",
            timeout=90,
        )
        assert done.state == "succeeded", agent.log()[-3000:]
        stored = {a.name: a for a in Artifact.objects.filter(run_id=run.pk, state="stored")}
        assert set(stored) == {"out/data.bin", "out/report.txt"}, agent.log()[-2000:]
        assert "out/too-big.bin: 300000 bytes is over maxFileBytes 250000" in agent.log()
        headers = operator_headers("artifact-reader", role="viewer")
        written = {
            "out/data.bin": "".join(f"{n}\n" for n in range(1, 40001)).encode(),
            "out/report.txt": b"report\n",
        }
        for name, artifact in stored.items():
            on_disk = written[name]
            assert artifact.sha256 == hashlib.sha256(on_disk).hexdigest() and artifact.size == len(on_disk)
            answer = client.get(f"/api/v1/ops/runs/{run.pk}/artifacts/{artifact.pk}", headers=headers)
            assert answer.status_code == 200 and b"".join(answer.streaming_content) == on_disk
    finally:
        agent.kill()


#: Waits (up to 30 s) until every name in $PEERS has a file ``$BARRIER/<prefix><name>``.
_WAIT = (
    'for i in $(seq 300); do all=1; for p in $PEERS; do [ -e "$BARRIER/{prefix}$p" ] || all=0; done; '
    "[ $all = 1 ] && break; sleep 0.1; done"
)
#: Both jobs run at once on one agent: each writes its own file under the same declared glob,
#: and waits until the other has written its file before it exits.
TWIN = (
    'touch "$BARRIER/start-$ME"; '
    + _WAIT.format(prefix="start-")
    + "; mkdir -p out && echo $ME > out/$ME.txt"
    ' && touch "$BARRIER/done-$ME"; ' + _WAIT.format(prefix="done-") + "; ls out"
)


def test_concurrent_attempts_on_one_agent_keep_their_own_work_directories(live_server, tmp_path):
    """Each attempt has its own work directory: two attempts running at once on one agent, both
    declaring ``out/*``, upload only their own file; the directories are gone afterwards."""
    agent = Agent(tmp_path / "state", tmp_path)
    work, barrier = tmp_path / "work", tmp_path / "barrier"
    barrier.mkdir()
    try:
        worker = worker_create(name=f"twins-{os.getpid()}")
        token = enrollment_token_create(worker_id=worker.pk).token
        assert agent.start("enroll", "--server", live_server.url, "--token", token).wait(30) == 0, agent.log()
        spec = OutputSpec(paths=("out/*",))
        runs = {
            me: enqueue(
                make_revision(
                    command=TWIN, env={"ME": me, "PEERS": "a b", "BARRIER": str(barrier)}, output=spec
                )
            )
            for me in ("a", "b")
        }
        agent.start("run", "--poll-max", "1", "--max-concurrent", "2", "--work-dir", str(work))
        for run in runs.values():
            done = wait_for(
                lambda run=run: Run.objects.filter(pk=run.pk, state__in=("succeeded", "failed")).first(),
                what="both runs to end",
                timeout=90,
            )
            assert done.state == "succeeded", agent.log()[-3000:]
        assert {p.name for p in barrier.iterdir()} == {"start-a", "start-b", "done-a", "done-b"}
        for me, run in runs.items():
            names = set(Artifact.objects.filter(run_id=run.pk, state="stored").values_list("name", flat=True))
            assert names == {f"out/{me}.txt"}, agent.log()[-2000:]
        wait_for(
            lambda: not any(work.iterdir()), what="the attempts' work directories to be removed", timeout=30
        )
    finally:
        agent.kill()
