"""No console page answers 500: every changelist, change and add page, for each role, with objects
in every state (workers online, draining, expired, offline, new, revoked; runs in each state)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse

from actions.placement import refresh_placement_summaries
from runs.models import Task
from tests.console.fixtures import PASSWORD, fleet_in_every_state, make_user

pytestmark = pytest.mark.django_db

ROLES = ("admin", "operator", "viewer")


@pytest.fixture
def fleet():
    made = fleet_in_every_state()
    refresh_placement_summaries()
    return made


@pytest.mark.parametrize("role", ROLES)
def test_every_page_answers_without_a_500_for_each_role(client, fleet, role):
    make_user(role)
    assert client.login(username=role, password=PASSWORD)
    visited = 0
    pages = [reverse("admin:index"), reverse("admin:index") + "?fragment=1"]
    for model, model_admin in admin.site._registry.items():
        meta = model._meta
        prefix = f"admin:{meta.app_label}_{meta.model_name}"
        pages.append(reverse(f"{prefix}_changelist"))
        pages.append(reverse(f"{prefix}_add"))
        for obj in model_admin.get_queryset(_request(role)).all()[:30]:
            pages.append(reverse(f"{prefix}_change", args=[obj.pk]))
    for state in ("online", "draining", "expired", "offline", "new", "revoked", "outdated"):
        pages.append(reverse("admin:workers_worker_changelist") + f"?live={state}")
    task = Task.objects.first()
    pages.append(reverse("admin:runs_run_changelist") + f"?task__id__exact={task.pk}")
    pages.append(reverse("admin:audit_event_changelist") + "?kind__in=attempt.failed,attempt.lost")
    pages.append(reverse("admin:audit_event_changelist") + "?created_at__gte=2026-01-01+00:00:00&q=operator")
    for reason in ("any", "none", "arch"):
        pages.append(reverse("admin:runs_run_changelist") + f"?waiting={reason}")
    for page in pages:
        answer = client.get(page)
        assert answer.status_code in (200, 302, 403), (page, answer.status_code)
        visited += 1
    assert visited > 40


def _request(role):
    class Request:
        user = User.objects.get(username=role)

    return Request()
