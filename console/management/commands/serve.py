"""Serve the control plane: the WSGI app under waitress, plus the in-process sweep loop.

The standalone profile has no broker: this process also runs the dispatch/sweep cycle every
``--sweep-interval`` seconds in one background thread. In the cluster-control profile Celery beat
runs the cycle; pass ``--sweep`` to run it here as well (cycles are safe to overlap).
"""

import threading

from django.conf import settings
from django.core.management.base import BaseCommand
from django.core.wsgi import get_wsgi_application
from waitress import serve

from actions.sweeps import loop
from core.conf import is_cluster

#: Largest body waitress will buffer: the operator API's limit (96 KiB) plus headroom.
MAX_REQUEST_BODY_BYTES = 128 * 1024


class Command(BaseCommand):
    help = "Serve the control plane (waitress) with the in-process sweep loop."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--threads", type=int, default=8)
        parser.add_argument("--sweep-interval", type=float, default=2.0, help="seconds between sweep cycles")
        parser.add_argument(
            "--sweep", action="store_true", help="run the sweep loop in the cluster profile too"
        )
        parser.add_argument("--no-sweep", action="store_true", help="do not run the sweep loop here")

    def handle(self, *args, **options):
        stop = threading.Event()
        sweeping = not options["no_sweep"] and (options["sweep"] or not is_cluster())
        if sweeping:
            threading.Thread(
                target=loop, args=(stop, options["sweep_interval"]), name="sweep-loop", daemon=True
            ).start()
        self.stdout.write(
            f"control plane on http://{options['host']}:{options['port']}/ "
            f"(profile {settings.QINGLONG_PROFILE}, sweeps {'in-process' if sweeping else 'elsewhere'})"
        )
        try:
            # waitress buffers a whole body before Django sees it (chunked bodies included), so its
            # own cap must sit just above the largest per-endpoint limit (BodyLimitMiddleware).
            serve(
                get_wsgi_application(),
                host=options["host"],
                port=options["port"],
                threads=options["threads"],
                ident="qinglong",
                max_request_body_size=MAX_REQUEST_BODY_BYTES,
            )
        finally:
            stop.set()
