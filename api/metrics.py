"""``/metrics``: the Prometheus text format, for an allowed address or a bearer token.

Counters and histograms come from ``core.metrics`` summed over every process of this control
plane (``PROMETHEUS_MULTIPROC_DIR``); the gauges below are read from the database at scrape
time, each one bounded query over an indexed column (non-terminal states only, never a scan of
finished runs). Access: a client address inside ``QINGLONG_METRICS_ALLOW`` (networks; loopback
by default) or ``Authorization: Bearer <QINGLONG_METRICS_TOKEN>``; anyone else gets 403
``permission_denied``. docs/operations.md lists every series.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, Min, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from audit.models import Event
from core.db import db_now
from leases.models import LeaseState, RunDispatchLease
from runs.models import Run
from runs.states import RUN_TERMINAL, AttemptState, RunState
from workers.models import LIVE_SESSION_STATES, Worker, WorkerSession, WorkerState
from workers.nonces import nonces_held
from workers.principals import cache_is_shared


class DatabaseGauges(Collector):
    """The gauges of one scrape, each from one bounded query."""

    def collect(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily("qinglong_workers", "Enrolled workers by state.", labels=["state"])
        counts = dict(Worker.objects.values_list("state").annotate(n=Count("id")))
        for state in WorkerState.values:
            workers.add_metric([state], counts.get(state, 0))
        yield workers

        sessions = GaugeMetricFamily(
            "qinglong_sessions_live", "Live worker sessions by state.", labels=["state"]
        )
        live = WorkerSession.objects.filter(state__in=LIVE_SESSION_STATES)
        counts = dict(live.values_list("state").annotate(n=Count("id")))
        for state in LIVE_SESSION_STATES:
            sessions.add_metric([state], counts.get(state, 0))
        yield sessions

        leases = GaugeMetricFamily(
            "qinglong_leases_active",
            "Active run leases by phase: claimed (no starting ACK yet), starting, running.",
            labels=["state"],
        )
        phases = RunDispatchLease.objects.filter(state=LeaseState.LEASED).aggregate(
            claimed=Count("id", filter=Q(starting_at__isnull=True)),
            starting=Count("id", filter=Q(starting_at__isnull=False, running_at__isnull=True)),
            running=Count("id", filter=Q(running_at__isnull=False)),
        )
        for phase, count in phases.items():
            leases.add_metric([phase], count or 0)
        yield leases

        runs = GaugeMetricFamily(
            "qinglong_runs", "Runs not yet finished, by state (queue depth).", labels=["state"]
        )
        live_states = [state for state in RunState.values if state not in RUN_TERMINAL]
        counts = dict(Run.objects.filter(state__in=live_states).values_list("state").annotate(n=Count("id")))
        for state in live_states:
            runs.add_metric([state], counts.get(state, 0))
        yield runs

        oldest = Run.objects.filter(state=RunState.QUEUED).aggregate(oldest=Min("created_at"))["oldest"]
        yield GaugeMetricFamily(
            "qinglong_oldest_queued_age_seconds",
            "Age of the oldest queued run (since it was created), 0 when none waits.",
            value=max(0.0, (db_now() - oldest).total_seconds()) if oldest else 0.0,
        )

        yield CounterMetricFamily(
            "qinglong_attempts_lost",
            "Attempts settled as lost (their worker vanished or was fenced while running), ever.",
            # The append-only audit log, on its (kind, created_at) index: one entry per lost attempt.
            value=Event.objects.filter(kind=f"attempt.{AttemptState.LOST}").count(),
        )

        if not cache_is_shared():  # the cluster profile's nonces live in Redis, with a TTL each
            yield GaugeMetricFamily(
                "qinglong_nonce_store_rows",
                "Replay nonces held in the database (standalone profile), expired rows not yet pruned too.",
                value=nonces_held(),
            )


def _allowed(request: HttpRequest) -> bool:
    token = settings.QINGLONG_METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in settings.QINGLONG_METRICS_ALLOW)


#: Expositions tried when a process's metric file is removed between the collector listing the
#: files and reading them (``manage.py serve`` forgets dead processes' files when a replica
#: starts; a scrape at that moment answered 500): each try lists the files afresh.
_SCRAPE_TRIES = 3


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Every series in the Prometheus text format (0.0.4); 403 JSON for a caller not allowed."""
    if not _allowed(request):
        return JsonResponse(
            {
                "code": "permission_denied",
                "message": "metrics are served to allowed addresses or with the metrics bearer token",
                "field": None,
            },
            status=403,
        )
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(DatabaseGauges())
    for _ in range(_SCRAPE_TRIES - 1):
        try:
            return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
        except FileNotFoundError:  # a dead process's file went between listing and reading
            continue
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
