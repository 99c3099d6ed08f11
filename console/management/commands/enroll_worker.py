"""Create a worker (if needed) and issue a single-use enrollment token, printed once."""

from django.core.management.base import BaseCommand, CommandError

from actions.enrollment import enrollment_token_create, worker_create
from core.errors import DomainError
from workers.models import Worker


class Command(BaseCommand):
    help = "Create a worker if it does not exist and print a single-use enrollment token for it."

    def add_arguments(self, parser):
        parser.add_argument("name", help="worker name (a lowercase slug)")
        parser.add_argument("--ttl", type=int, default=None, help="token lifetime in seconds (default 24 h)")
        parser.add_argument("--server", default="http://127.0.0.1:8000", help="URL shown in the hint")
        parser.add_argument("--token-only", action="store_true", help="print only the token")

    def handle(self, *args, **options):
        try:
            worker = Worker.objects.filter(name=options["name"]).first() or worker_create(
                name=options["name"], actor="manage.py"
            )
            issued = enrollment_token_create(worker_id=worker.pk, ttl_seconds=options["ttl"])
        except DomainError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        if options["token_only"]:
            self.stdout.write(issued.token)
            return
        self.stdout.write(f"worker {worker.name} ({worker.pk})")
        self.stdout.write(
            f"enrollment token (single use, expires {issued.record.expires_at:%Y-%m-%d %H:%M} UTC):"
        )
        self.stdout.write(f"  {issued.token}")
        self.stdout.write("on the worker machine:")
        self.stdout.write(f"  qinglong-worker enroll --server {options['server']} --token {issued.token}")
