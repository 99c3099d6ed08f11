"""The Celery app. Tasks are thin wrappers around service functions (``*/tasks.py``).

In the cluster-control profile Celery beat runs ``qinglong.tasks.sweep_cycle`` on the Redis
broker (``CELERY_BROKER_URL``); the standalone profile needs no broker (``manage.py serve`` runs
the same cycle in-process).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")

app = Celery("qinglong")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["qinglong"])
