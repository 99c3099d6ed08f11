"""Take a worker's live session offline from the command line (operator; ADR-0012 §5)."""

from django.core.management.base import BaseCommand, CommandError

from actions.sessions.shutdown import session_operator_offline
from core.errors import DomainError
from workers.models import Worker


class Command(BaseCommand):
    help = (
        "Take a worker's live session offline. Refused while it holds active run leases unless "
        "--force, which settles them (started attempts become lost and retry per policy)."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="worker name")
        parser.add_argument("--force", action="store_true", help="settle the session's active run leases")

    def handle(self, *args, **options):
        worker = Worker.objects.filter(name=options["name"]).first()
        if worker is None:
            raise CommandError(f"no worker named {options['name']!r}")
        try:
            view = session_operator_offline(worker_id=worker.pk, force=options["force"], actor="manage.py")
        except DomainError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        session = view.session
        self.stdout.write(
            f"{worker.name}: session generation {session.generation} {session.state} ({session.end_reason})"
        )
