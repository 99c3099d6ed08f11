"""Admin helpers shared by the apps: protocol-owned rows are read-only in the admin."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written only by services (sessions, leases, attempts, events): view, never edit."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
