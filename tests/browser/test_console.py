"""The operator console in a real browser (headless chromium) against a live server and a real
agent process: roles, the dashboard following a worker's life and death, enrolling from the
admin, creating and running a task, cancelling, draining and revoking.

Every page visited is screenshotted under var/screenshots/ and checked to fit 1280 px."""

from __future__ import annotations

import re
import signal

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from actions.placement import refresh_placement_summaries
from runs.models import Run, Task
from tests.agent.processes import wait_for
from tests.agent.test_cancel_running import agent
from tests.browser.conftest import SCREENSHOTS, shot
from tests.console.fixtures import fleet_in_every_state
from workers.models import Worker, WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def figure_is(name: str, value: str) -> str:
    """A page predicate: the dashboard figure ``name`` reads ``value`` (while the page polls)."""
    return f"document.querySelector('[data-figure=\"{name}\"] .ql-value')?.textContent.trim() === '{value}'"


def figure(page, name: str) -> str:
    return page.inner_text(f'[data-figure="{name}"] .ql-value').strip()


def test_each_role_sees_the_console_and_a_viewer_sees_no_state_changing_control(console, protocol_settings):
    protocol_settings(SESSION_LEASE_SECONDS=900)  # "online" must stay online however slow the machine
    made = fleet_in_every_state()
    refresh_placement_summaries()  # one dispatch cycle's summaries: why the arm-only run waits
    running = made["running"]
    for role in ("admin", "operator", "viewer"):
        tab = console(role)
        tab.shot(f"dashboard-{role}")
        if role == "admin":  # the figures alone: what docs/console-dashboard.png shows
            tab.page.locator("#ql-dashboard").screenshot(path=str(SCREENSHOTS / "dashboard-figures.png"))
        assert figure(tab.page, "workers-online") == "1"
        assert figure(tab.page, "workers-expired") == "1"
        assert figure(tab.page, "workers-draining") == "1"
        assert figure(tab.page, "reason-arch") == "1"
        tab.go("/admin/workers/worker/")
        tab.shot(f"workers-{role}")
        rows = tab.page.inner_text("#result_list")
        assert "lapsed-1" in rows and "Active" not in rows
        assert "expired" in tab.page.inner_text("#result_list tr:has-text('lapsed-1')")
        online = Worker.objects.get(name="online-1")
        tab.go(f"/admin/workers/worker/{online.pk}/change/")
        tab.shot(f"worker-{role}")
        tab.go(f"/admin/runs/run/{running.pk}/change/")
        tab.shot(f"run-{role}")
        task = Task.objects.get(name="sample-task")
        tab.go(f"/admin/runs/task/{task.pk}/change/")
        tab.shot(f"task-{role}")
        assert "hunter2" not in tab.page.content()  # a secret-looking variable is masked
        tab.go("/admin/audit/event/")
        tab.shot(f"events-{role}")
        tab.go("/admin/runs/run/")
        tab.shot(f"runs-{role}")
        controls = _state_changing_controls(tab, online.pk, running.pk, task.pk)
        if role == "viewer":
            assert controls == [], controls
        else:
            assert "drain" in controls and "cancel" in controls and "run now" in controls, controls
        tab.page.close()


def _state_changing_controls(tab, worker_id, run_id, task_id) -> list[str]:
    """Every control on the main pages that would change state, by name."""
    found = []
    for path in ("/admin/workers/worker/", "/admin/runs/run/", "/admin/runs/task/"):
        tab.go(path)
        found += [
            o.lower()
            for o in tab.page.locator("select[name=action] option").all_inner_texts()
            if o != "---------"
        ]
        if tab.page.locator("a.addlink").count():
            found.append(f"add on {path}")
    tab.go(f"/admin/workers/worker/{worker_id}/change/")
    found += [b.get_attribute("data-action") for b in tab.page.locator("button[data-action]").all()]
    found += ["save"] * tab.page.locator("input[name=_save]").count()
    tab.go(f"/admin/runs/run/{run_id}/change/")
    found += [b.get_attribute("data-action") for b in tab.page.locator("button[data-action]").all()]
    tab.go(f"/admin/runs/task/{task_id}/change/")
    found += ["run now"] * tab.page.locator("#ql-run-now").count()
    found += ["save"] * tab.page.locator("input[name=_save]").count()
    return found


def test_the_dashboard_shows_a_worker_come_online_and_its_death(
    console, live_server, tmp_path, protocol_settings
):
    """SIGKILL of the agent: the dashboard and the worker list show it expired within one session
    lease (plus the page's own refresh), with no reload by the test."""
    protocol_settings(SESSION_LEASE_SECONDS=6, HEARTBEAT_INTERVAL_SECONDS=2)
    tab = console("admin")
    assert figure(tab.page, "workers-online") == "0"
    worker = worker_create(name="short-lived")
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    assert agent(state, "enroll", "--server", live_server.url, "--token", issued.token).wait(30) == 0
    # Short polls: the test's live server is a WSGI thread, which cannot see a waiting claim's
    # client vanish (the ASGI server of manage.py serve ends the wait when its client goes away),
    # so a held wait would keep the dead worker's session alive for the rest of its wait bound.
    process = agent(state, "run", "--poll-max", "1", "--no-long-poll")
    try:
        tab.page.wait_for_function(figure_is("workers-online", "1"), timeout=20_000)
        tab.shot("dashboard-worker-online")
        lists = tab.page.context.new_page()
        lists.goto(live_server.url + "/admin/workers/worker/")
        assert "online" in lists.inner_text("#result_list tr:has-text('short-lived')")
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        # lease 6 s, then at most one refresh of each page (2 s dashboard, 3 s list)
        tab.page.wait_for_function(figure_is("workers-expired", "1"), timeout=12_000)
        assert figure(tab.page, "workers-online") == "0"
        tab.shot("dashboard-worker-expired")
        lists.wait_for_function(
            "document.querySelector('#result_list')?.innerText.includes('expired')", timeout=12_000
        )
        shot(lists, "workers-after-death")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_enroll_run_cancel_drain_and_revoke_from_the_admin(console, live_server, tmp_path, protocol_settings):
    protocol_settings(HEARTBEAT_INTERVAL_SECONDS=2, SESSION_LEASE_SECONDS=10)
    tab = console("admin")
    page = tab.page

    # Enroll: Add worker shows the token and the exact command once.
    tab.go("/admin/workers/worker/add/")
    page.fill("#id_name", "build-box-1")
    page.click("input[name=_save]")
    command = page.inner_text("#ql-enroll-command")
    tab.shot("worker-enrolled")
    token = re.search(r"--token (qlenroll_\S+)", command).group(1)
    assert f"--server {live_server.url}" in command
    state = tmp_path / "state"
    assert agent(state, "enroll", "--server", live_server.url, "--token", token).wait(30) == 0
    process = agent(state, "run", "--poll-max", "1")
    try:
        worker = Worker.objects.get(name="build-box-1")
        wait_for(lambda: WorkerSession.objects.filter(worker=worker, state="online").exists(), what="online")

        # Create a task, run it, see it succeed with its output.
        tab.go("/admin/runs/task/add/")
        page.fill("#id_name", "hello-console")
        page.fill("#id_command", "echo hello-from-the-console")
        page.fill("#id_timeout_seconds", "60")
        page.fill("#id_placement", '{"required": {"arch": ["sparc"]}}')
        page.click("input[name=_save]")
        assert "unknown architecture" in page.inner_text(".field-placement .errorlist")  # a field error
        tab.shot("task-add-error")
        page.fill("#id_placement", "")
        page.click("input[name=_save]")
        task = Task.objects.get(name="hello-console")
        tab.go(f"/admin/runs/task/{task.pk}/change/")
        page.click("#ql-run-now")
        page.wait_for_url(re.compile(r"/admin/runs/run/[0-9a-f-]+/change/"))
        run = Run.objects.get(task=task)
        wait_for(lambda: Run.objects.get(pk=run.pk).state == "succeeded", timeout=30, what="success")
        page.reload()
        assert "hello-from-the-console" in page.inner_text("#ql-stdout")
        assert "succeeded" in page.inner_text(".field-state_label")
        tab.shot("run-succeeded")

        # Edit the task: a new revision, shown with its diff.
        tab.go(f"/admin/runs/task/{task.pk}/change/")
        page.fill("#id_command", "sleep 300")
        page.click("input[name=_save]")
        assert task.revisions.count() == 2
        tab.go(f"/admin/runs/task/{task.pk}/change/")
        assert "+command | sleep 300" in page.inner_text(".field-history")
        tab.shot("task-history")

        # Cancel a running run.
        page.click("#ql-run-now")
        page.wait_for_url(re.compile(r"/admin/runs/run/[0-9a-f-]+/change/"))
        sleeper = Run.objects.filter(task=task).order_by("-created_at").first()
        wait_for(lambda: Run.objects.get(pk=sleeper.pk).state == "running", timeout=30, what="running")
        page.reload()
        page.click("button[data-action=cancel]")
        assert "cancellation requested" in page.inner_text(".messagelist")
        wait_for(lambda: Run.objects.get(pk=sleeper.pk).state == "cancelled", timeout=30, what="cancelled")
        page.reload()
        tab.shot("run-cancelled")

        # Drain: the session drains; undrain; revoke: the agent exits 4 (credential refused).
        tab.go(f"/admin/workers/worker/{worker.pk}/change/")
        page.click("button[data-action=drain]")
        assert "build-box-1: draining" in page.inner_text(".messagelist")
        wait_for(
            lambda: WorkerSession.objects.filter(worker=worker, state="draining").exists(), what="draining"
        )
        page.reload()
        assert "draining" in page.inner_text(".field-live")
        tab.shot("worker-draining")
        page.click("button[data-action=revoke]")
        assert "build-box-1: revoked" in page.inner_text(".messagelist")
        assert process.wait(30) == 4
        page.click("button[data-action=undrain]")
        assert "nothing changed, the worker is revoked" in page.inner_text(".messagelist")
        page.reload()
        assert "revoked" in page.inner_text(".field-live")
        tab.shot("worker-revoked")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
