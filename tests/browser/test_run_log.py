"""The run page follows a live log (issue 14): a real agent runs a job printing a line every
0.2 s; the page's own script (no build step) appends what the operator API returns after the
last offset, while the run is active, and shows the whole log once it ended."""

from __future__ import annotations

import re

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from runs.models import Run, RunAttempt
from tests.agent.processes import wait_for
from tests.agent.test_cancel_running import agent
from tests.browser.conftest import shot
from tests.helpers import enqueue, make_revision

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOB = "for i in $(seq 1 60); do echo tick $i; echo warn $i >&2; sleep 0.25; done"


def test_the_run_page_follows_a_live_log_while_a_real_agent_runs_the_job(
    console, live_server, tmp_path, settings
):
    settings.STORAGES = {
        **settings.STORAGES,
        "output": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "output")},
        },
    }
    worker = worker_create(name="log-browser")
    state = tmp_path / "state"
    token = enrollment_token_create(worker_id=worker.pk).token
    assert agent(state, "enroll", "--server", live_server.url, "--token", token).wait(30) == 0
    run = enqueue(make_revision(command=JOB, timeout_seconds=120))
    process = agent(state, "run", "--poll-max", "1")
    try:
        wait_for(lambda: RunAttempt.objects.filter(run=run, state="running").exists(), what="the job to run")
        tab = console("viewer")
        page = tab.page
        tab.go(f"/admin/runs/run/{run.pk}/change/")
        log = page.locator("#ql-log-1")
        page.wait_for_function("document.querySelector('#ql-log-1').textContent.includes('tick 3')")
        seen_first = log.text_content()
        assert Run.objects.get(pk=run.pk).state == "running", "the page must show the log while it runs"
        later = max(int(n) for n in re.findall(r"tick (\d+)", seen_first)) + 4
        page.wait_for_function(f"document.querySelector('#ql-log-1').textContent.includes('tick {later}\\n')")
        grown = log.text_content()
        assert len(grown) > len(seen_first) and grown.startswith(seen_first)  # appended, not reloaded
        assert Run.objects.get(pk=run.pk).state == "running"
        shot(page, "run-live-log")
        wait_for(lambda: Run.objects.get(pk=run.pk).state == "succeeded", timeout=60, what="the run to end")
        page.wait_for_function(
            "document.querySelector('#ql-log-1').dataset.complete === 'true'", timeout=30_000
        )
        final = log.text_content()
        assert re.findall(r"tick (\d+)", final) == [str(i) for i in range(1, 61)]
        assert re.findall(r"warn (\d+)", final) == [str(i) for i in range(1, 61)]
        # the whole log after the run ended, rendered by the page itself
        tab.go(f"/admin/runs/run/{run.pk}/change/")
        assert "tick 60" in page.locator("#ql-log-1").text_content()
        shot(page, "run-ended-log")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
