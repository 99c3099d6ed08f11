from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operators' interfaces: the Django admin for every model, and the management commands."""

    name = "console"
    verbose_name = "Operator console"
