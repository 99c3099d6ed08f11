from django.apps import AppConfig


class QinglongConfig(AppConfig):
    name = "qinglong"
    verbose_name = "QingLong control plane"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the profile checks)
