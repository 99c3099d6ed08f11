"""The control plane's Prometheus counters and histograms (``/metrics``, docs/operations.md).

Incremented by the interface layer — the API's request middleware (``api.observability``) and
the sweep runner (``actions.sweeps.run_cycle``, after its transactions) — never inside a write
path's transaction. Gauges (workers, sessions, leases, queue depth, nonce store) are read from the
database at scrape time by ``api.metrics``.

Several processes (Granian's server processes, the sweep loop of ``manage.py serve``, Celery)
write the same series: with ``PROMETHEUS_MULTIPROC_DIR`` set (settings does, per control plane)
prometheus_client keeps each process's values in a file there and a scrape sums them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

#: Request latency buckets, seconds: a signed call takes milliseconds; a long poll (issue 18) up to 30 s.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

HTTP_REQUESTS = Counter(
    "qinglong_http_requests_total",
    "HTTP requests answered by Django, by endpoint (route pattern), method and status code.",
    ["endpoint", "method", "status"],
)
HTTP_LATENCY = Histogram(
    "qinglong_http_request_duration_seconds",
    "Time from Django receiving a request to its response, by endpoint (route pattern).",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)
WORKER_CALLS = Counter(
    "qinglong_worker_calls_total",
    "Worker protocol calls by call (claim, renew, complete, activate, release, heartbeat, register) "
    "and outcome code (`ok` or the error code answered).",
    ["call", "outcome"],
)
WAITING_CLAIMS = Gauge(
    "qinglong_waiting_claims",
    "Waiting claims (claim/wait) held open right now, summed over the live server processes.",
    multiprocess_mode="livesum",
)
SWEEP_DURATION = Histogram(
    "qinglong_sweep_duration_seconds",
    "Duration of one sweep cycle (sessions, leases, retries, placement summaries, nonces).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
SWEEP_ITEMS = Counter(
    "qinglong_sweep_items_total",
    "Items a sweep cycle settled, by kind (sessions_expired, leases_settled, retries_queued, "
    "summaries_changed, nonces_pruned).",
    ["kind"],
)


def sweep_observe(*, seconds: float, items: dict[str, int]) -> None:
    """Record one finished sweep cycle: its duration (seconds) and the items of each kind."""
    SWEEP_DURATION.observe(seconds)
    for kind, count in items.items():
        SWEEP_ITEMS.labels(kind=kind).inc(count)
