"""The Celery app. Tasks are thin wrappers around service functions (``*/tasks.py``).

In the cluster-control profile Celery beat runs ``qinglong.tasks.sweep_cycle`` on the Redis
broker (``CELERY_BROKER_URL``); the standalone profile needs no broker (``manage.py serve`` runs
the same cycle in-process). Run both in one process with ``celery -A qinglong worker --beat``;
the cycle is safe to run on several replicas at once (``actions.sweeps``).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")

app = Celery("qinglong")
app.config_from_object("django.conf:settings", namespace="CELERY")
# One Redis may serve several deployments (or test runs) at once: each names its own queue so
# that one deployment's workers never run another's sweep against the wrong database.
app.conf.task_default_queue = os.environ.get("QINGLONG_CELERY_QUEUE", "celery")
app.autodiscover_tasks(["qinglong"])
