"""DRF's default permission: refuse. Every view names its own (``api.base``)."""

from rest_framework.permissions import BasePermission


class DenyAll(BasePermission):
    """A view that forgot to name its permission is closed, not open."""

    def has_permission(self, request, view) -> bool:
        return False
