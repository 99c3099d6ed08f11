"""The console's admin site: Django's, with the fleet dashboard as its landing page."""

from __future__ import annotations

from django.contrib import admin
from django.template.response import TemplateResponse

from console import dashboard
from core.db import db_now


class ConsoleAdminSite(admin.AdminSite):
    """``/admin/`` opens on the dashboard (``console.dashboard``); ``?fragment=1`` answers the
    figures alone, which the page polls to stay current without a reload."""

    site_header = "QingLong control plane"
    site_title = "QingLong control plane"
    index_title = "Fleet"
    index_template = "admin/dashboard.html"
    enable_nav_sidebar = False  # the width goes to the tables (no overflow at 1280 px)

    def index(self, request, extra_context=None):
        """The dashboard and, below it, the models the user may see."""
        context = {"board": dashboard.build(now=db_now()), **(extra_context or {})}
        if request.GET.get("fragment") == "1":
            return TemplateResponse(
                request, "admin/dashboard_figures.html", {**self.each_context(request), **context}
            )
        return super().index(request, extra_context=context)
