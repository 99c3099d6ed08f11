"""Operator actions on a worker from the command line: revoke, drain, undrain, force rotation."""

from django.core.management.base import BaseCommand, CommandError

from actions.credentials import credential_force_rotation
from actions.workers import worker_drain, worker_revoke, worker_undrain
from core.errors import DomainError
from workers.models import Worker

ACTIONS = {
    "revoke": worker_revoke,
    "drain": worker_drain,
    "undrain": worker_undrain,
    "rotate": credential_force_rotation,
}


class Command(BaseCommand):
    help = "revoke | drain | undrain | rotate a worker (by name)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=sorted(ACTIONS))
        parser.add_argument("name")

    def handle(self, *args, **options):
        worker = Worker.objects.filter(name=options["name"]).first()
        if worker is None:
            raise CommandError(f"no worker named {options['name']!r}")
        try:
            worker = ACTIONS[options["action"]](worker_id=worker.pk, actor="manage.py")
        except DomainError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(f"{worker.name}: state={worker.state}")
