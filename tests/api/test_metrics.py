"""``/metrics`` (api/metrics.py, core/metrics.py; docs/operations.md "Metrics").

Access rules in-process; the series against a real ``manage.py serve`` (Granian's server process
and the in-process sweep loop write them, a scrape sums both) while a real agent claims and
completes a run.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from actions.enrollment import enrollment_token_create, worker_create
from core.metrics import HTTP_REQUESTS
from runs.models import Run
from tests.agent.processes import ROOT, Agent, ControlPlane, wait_for
from tests.helpers import enqueue, make_revision

SERIES = {
    "qinglong_workers",
    "qinglong_sessions_live",
    "qinglong_leases_active",
    "qinglong_runs",
    "qinglong_oldest_queued_age_seconds",
    "qinglong_attempts_lost",
    "qinglong_nonce_store_rows",
    "qinglong_worker_calls",
    "qinglong_http_requests",
    "qinglong_http_request_duration_seconds",
    "qinglong_sweep_duration_seconds",
    "qinglong_sweep_items",
}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a Prometheus text exposition."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.django_db
def test_metrics_are_refused_outside_the_allowlist_without_the_token(client, settings):
    settings.QINGLONG_METRICS_TOKEN = "s3cret-token"
    outsider = {"REMOTE_ADDR": "203.0.113.5"}
    refused = client.get("/metrics", **outsider)
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    wrong = client.get("/metrics", headers={"authorization": "Bearer nope"}, **outsider)
    assert wrong.status_code == 403
    allowed = client.get("/metrics", headers={"authorization": "Bearer s3cret-token"}, **outsider)
    assert allowed.status_code == 200 and allowed["Content-Type"].startswith("text/plain")
    assert client.get("/metrics").status_code == 200  # loopback is in the default allowlist
    settings.QINGLONG_METRICS_TOKEN = ""
    assert client.get("/metrics", headers={"authorization": "Bearer "}, **outsider).status_code == 403


@pytest.mark.django_db
def test_a_metric_file_removed_while_it_is_read_does_not_fail_the_scrape(client, monkeypatch):
    """serve forgets dead processes' files when a replica starts (``forget_dead_processes``); a
    scrape that listed such a file and then could not open it answered 500 (seen in a clean-clone
    test run, two control planes sharing one metrics folder). The scrape lists the files afresh."""
    real = MmapedDict.read_all_values_from_file
    failed: list[str] = []

    def vanishing(filename):
        if not failed:
            failed.append(filename)
            raise FileNotFoundError(2, "No such file or directory", filename)
        return real(filename)

    HTTP_REQUESTS.labels(endpoint="/test", method="GET", status="200").inc()  # at least one file
    monkeypatch.setattr(MmapedDict, "read_all_values_from_file", staticmethod(vanishing))
    answer = client.get("/metrics")
    assert failed and answer.status_code == 200
    assert "qinglong_http_requests_total" in answer.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_series_move_when_a_real_agent_claims_and_completes_a_run(tmp_path):
    plane = ControlPlane(
        tmp_path, QINGLONG_HEARTBEAT_INTERVAL_SECONDS="1", PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics")
    )
    agent = Agent(tmp_path / "state", tmp_path)

    def scrape() -> dict:
        with urllib.request.urlopen(plane.url + "/metrics", timeout=10) as answer:
            return samples(answer.read().decode())

    try:
        plane.start()
        worker = worker_create(name=f"metrics-{os.getpid()}")
        token = enrollment_token_create(worker_id=worker.pk).token
        assert agent.start("enroll", "--server", plane.url, "--token", token).wait(30) == 0, agent.log()
        agent.start("run", "--poll-max", "1", "--timeout", "5")
        online = ("qinglong_sessions_live", (("state", "online"),))
        before = wait_for(lambda: (s := scrape()).get(online) == 1 and s, what="the agent's session")
        run = enqueue(make_revision(command="echo metrics"))
        wait_for(lambda: Run.objects.get(pk=run.pk).state == "succeeded", what="the run")
        after = wait_for(
            lambda: (s := scrape()).get(("qinglong_runs", (("state", "running"),))) == 0 and s, what="settled"
        )
    finally:
        agent.kill()
        plane.stop()

    names = {re.sub(r"_(total|bucket|count|sum|created)$", "", name) for name, _ in after}
    assert SERIES <= names, SERIES - names

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("qinglong_worker_calls_total", call="claim", outcome="offered") == 1
    assert moved("qinglong_worker_calls_total", call="complete", outcome="ok") == 1
    assert moved("qinglong_worker_calls_total", call="starting", outcome="ok") == 1
    assert (
        moved(
            "qinglong_http_requests_total",
            endpoint="/api/v1/worker/lease/complete",
            method="POST",
            status="200",
        )
        == 1
    )
    # The agent claims by waiting claims by default (docs/leases.md "Waiting claims").
    assert moved("qinglong_http_request_duration_seconds_count", endpoint="/api/v1/worker/claim/wait") >= 1
    assert moved("qinglong_sweep_duration_seconds_count") >= 1  # written by the sweep loop's process
    assert after[("qinglong_workers", (("state", "active"),))] == 1
    assert after[("qinglong_leases_active", (("state", "running"),))] == 0
    assert after[("qinglong_nonce_store_rows", ())] > before[("qinglong_nonce_store_rows", ())]


def test_the_example_grafana_dashboard_queries_only_series_that_exist():
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    queried = {
        re.sub(r"_(total|bucket|count|sum)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"qinglong_[a-z_]+", target["expr"])
    }
    assert queried and queried <= SERIES, queried - SERIES
