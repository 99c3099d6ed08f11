"""Run the dispatch/sweep cycle once (default) or in a loop (``--loop``)."""

import threading
from dataclasses import asdict

from django.core.management.base import BaseCommand

from actions.sweeps import loop, run_cycle


class Command(BaseCommand):
    help = (
        "Expire lapsed sessions and leases, queue due retries, admit due schedule fires, "
        "refresh pending placement summaries."
    )

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true")
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between cycles with --loop")

    def handle(self, *args, **options):
        if options["loop"]:
            loop(threading.Event(), options["interval"])
            return
        self.stdout.write(" ".join(f"{k}={v}" for k, v in asdict(run_cycle()).items()))
