from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from console.admin.base import ReadOnlyAdmin, short_id, when
from leases.models import RunDispatchLease


@admin.register(RunDispatchLease)
class RunDispatchLeaseAdmin(ReadOnlyAdmin):
    list_display = (
        "lease",
        "run_link",
        "lease_generation",
        "worker",
        "session_generation",
        "state",
        "release_reason",
        "version",
        "expires",
        "claimed",
    )
    list_filter = ("state", "release_reason")
    list_select_related = ("worker",)
    search_fields = ("=attempt__id", "=run__id", "worker__name")
    exclude = ("token_digest",)

    @admin.display(description="lease", ordering="id")
    def lease(self, lease):
        return short_id(lease.pk)

    @admin.display(description="run")
    def run_link(self, lease):
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:runs_run_change", args=[lease.run_id]),
            short_id(lease.run_id),
        )

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, lease):
        return when(lease.expires_at)

    @admin.display(description="claimed", ordering="claimed_at")
    def claimed(self, lease):
        return when(lease.claimed_at)
