from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ConsoleConfig(AppConfig):
    """The operators' interfaces: the Django admin for every model, and the management commands."""

    default = True
    name = "console"
    verbose_name = "Operator console"


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """Django's admin app with the console's site (dashboard landing page) as its default site."""

    default = False
    default_site = "console.sites.ConsoleAdminSite"
