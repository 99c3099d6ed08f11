"""The audit log: every event row, filterable by actor, action (kind), target and time; read-only
for everyone. Target columns link to the object the event is about."""

import json

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from audit.models import Event
from console.admin.base import ReadOnlyAdmin, short_id, when


def _link(name: str, value) -> str:
    if value is None:
        return "—"
    return format_html('<a href="{}">{}</a>', reverse(name, args=[value]), short_id(value))


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "time", "kind", "who", "worker", "run", "attempt", "data_text")
    list_filter = ("kind", "actor_type")
    search_fields = ("=actor", "=worker_id", "=run_id", "=attempt_id", "=session_id", "kind")
    search_help_text = "an actor's name, a worker, run, attempt or session id, or an event kind"
    date_hierarchy = "created_at"
    show_full_result_count = False
    readonly_fields = ("time", "worker", "run", "attempt", "session", "data_text")
    fields = (
        "kind",
        "time",
        "actor_type",
        "actor",
        "worker",
        "session",
        "run",
        "attempt",
        "run_sequence",
        "data_text",
    )

    @admin.display(description="time", ordering="created_at")
    def time(self, event):
        return when(event.created_at)

    @admin.display(description="actor", ordering="actor")
    def who(self, event):
        return f"{event.actor_type}: {event.actor}" if event.actor else event.actor_type

    @admin.display(description="worker")
    def worker(self, event):
        return _link("admin:workers_worker_change", event.worker_id)

    @admin.display(description="session")
    def session(self, event):
        return _link("admin:workers_workersession_change", event.session_id)

    @admin.display(description="run")
    def run(self, event):
        return _link("admin:runs_run_change", event.run_id)

    @admin.display(description="attempt")
    def attempt(self, event):
        return _link("admin:runs_runattempt_change", event.attempt_id)

    @admin.display(description="facts")
    def data_text(self, event):
        return json.dumps(event.data, sort_keys=True) if event.data else ""
