from django.apps import AppConfig


class LogsConfig(AppConfig):
    name = "logs"
    label = "logs"
    verbose_name = "Job output"
    default_auto_field = "django.db.models.BigAutoField"
