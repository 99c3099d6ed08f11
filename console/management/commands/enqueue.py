"""Enqueue a run of a task's newest revision."""

from django.core.management.base import BaseCommand, CommandError

from actions.runs import run_enqueue
from audit.models import ActorType
from core.errors import DomainError
from runs import selectors


class Command(BaseCommand):
    help = "Enqueue a run of TASK (its newest revision); prints the run id."

    def add_arguments(self, parser):
        parser.add_argument("task")
        parser.add_argument("--priority", type=int, default=0)

    def handle(self, *args, **options):
        try:
            revision = selectors.latest_revision(selectors.task_by_name(options["task"]))
            run = run_enqueue(
                revision_id=revision.pk,
                priority=options["priority"],
                actor_type=ActorType.OPERATOR,
                actor="manage.py",
            )
        except DomainError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(str(run.pk))
