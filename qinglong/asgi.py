"""ASGI entry point (``manage.py serve`` runs it under Granian): Django behind ``RequestGuard``.

The guard enforces the limits the server does not (header count, body size and read deadline,
requests inside Django at once; ``qinglong.serving``), configured by ``settings.QINGLONG_SERVER``.
"""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

from qinglong.serving import RequestGuard

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
django_application = get_asgi_application()
application = RequestGuard(
    django_application,
    max_headers=settings.QINGLONG_SERVER["MAX_HEADERS"],
    max_body_bytes=settings.QINGLONG_SERVER["MAX_BODY_BYTES"],
    body_timeout_seconds=settings.QINGLONG_SERVER["BODY_TIMEOUT_SECONDS"],
    max_active=settings.QINGLONG_SERVER["MAX_ACTIVE_REQUESTS"],
)
