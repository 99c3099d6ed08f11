"""QingLong remote worker control plane (ADR-0012): the Django project package."""

from .celery import app as celery_app

__all__ = ["celery_app"]
