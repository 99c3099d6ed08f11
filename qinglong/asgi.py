"""ASGI entry point, for deployments that front Django with an ASGI server."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
application = get_asgi_application()
