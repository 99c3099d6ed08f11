from django.contrib import admin

from audit.models import Event
from console.admin.base import ReadOnlyAdmin


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "kind", "actor_type", "actor", "worker_id", "run_id", "data")
    list_filter = ("kind", "actor_type")
    search_fields = ("=worker_id", "=run_id", "=attempt_id", "=session_id", "kind")
    date_hierarchy = "created_at"
    show_full_result_count = False
