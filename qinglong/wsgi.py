"""WSGI entry point, for a WSGI server (``manage.py serve`` runs the ASGI app, qinglong.asgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
application = get_wsgi_application()
