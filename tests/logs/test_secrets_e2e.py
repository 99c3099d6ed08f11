"""A secret printed one character at a time by a real job (issue 14, Secrets): the agent masks it
before sending, holding back a possible secret's beginning across reads, and the stored log
never contains it."""

from __future__ import annotations

import os

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from runs.models import Run
from runs.revisions import OutputSpec
from tests.agent.processes import Agent, wait_for
from tests.helpers import enqueue, make_revision, operator_headers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SECRET = "s3cr3t-value"
#: Each character is its own write (and read): the secret is split across many reads and chunks.
JOB = (
    'printf "token="; for c in $(echo "$API_TOKEN" | sed "s/./& /g"); do printf %s "$c"; sleep 0.1; done; '
    'echo; printf "%s\\n" "$API_TOKEN" >&2; printf "tail=s3cr"'
)


def test_a_secret_printed_character_by_character_is_never_stored(live_server, tmp_path, client):
    agent = Agent(tmp_path / "state", tmp_path)
    try:
        worker = worker_create(name=f"secrets-{os.getpid()}")
        token = enrollment_token_create(worker_id=worker.pk).token
        assert agent.start("enroll", "--server", live_server.url, "--token", token).wait(30) == 0, agent.log()
        revision = make_revision(
            command=JOB, env={"API_TOKEN": SECRET}, output=OutputSpec(secret_env=("API_TOKEN",))
        )
        run = enqueue(revision)
        agent.start("run", "--poll-max", "1", "--work-dir", str(tmp_path / "work"))
        done = wait_for(
            lambda: Run.objects.filter(pk=run.pk, state__in=("succeeded", "failed")).first(),
            what="the run to end",
            timeout=90,
        )
        assert done.state == "succeeded", agent.log()[-3000:]
        headers = operator_headers("secret-reader", role="viewer")
        stored = client.get(f"/api/v1/ops/runs/{run.pk}/log", headers=headers).content
        assert SECRET.encode() not in stored and b"3t-val" not in stored, stored
        # Masked whole by the agent: no "*" of the control plane's across-chunks fallback.
        assert b"*" not in stored and stored.count(b"[MASKED]") == 2, stored
        stdout = client.get(f"/api/v1/ops/runs/{run.pk}/log?stream=stdout", headers=headers).content
        assert stdout == b"token=[MASKED]\ntail=s3cr", stored
    finally:
        agent.kill()
