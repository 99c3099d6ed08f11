from django.apps import AppConfig


class QinglongConfig(AppConfig):
    name = "qinglong"
    verbose_name = "QingLong control plane"

    def ready(self) -> None:
        # Django requires checks to register once the app registry is ready, not at import.
        from . import checks  # noqa: F401, PLC0415
