from django.contrib import admin

from console.admin.base import ReadOnlyAdmin
from leases.models import RunDispatchLease


@admin.register(RunDispatchLease)
class RunDispatchLeaseAdmin(ReadOnlyAdmin):
    list_display = (
        "attempt",
        "lease_generation",
        "worker",
        "session_generation",
        "state",
        "release_reason",
        "version",
        "expires_at",
        "claimed_at",
    )
    list_filter = ("state", "release_reason")
    list_select_related = ("worker", "attempt")
    search_fields = ("=attempt__id", "=run__id", "worker__name")
    exclude = ("token_digest",)
