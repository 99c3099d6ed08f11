"""Create (or reset) an operator login with a random password and an API token; print both once."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from accounts.roles import Role
from actions.tokens import MAX_TTL_SECONDS, MIN_TTL_SECONDS, api_token_create


class Command(BaseCommand):
    help = (
        "Create or reset a superuser login and an API token scoped to a role (printed once; "
        "only the token's digest is stored)."
    )

    def add_arguments(self, parser):
        parser.add_argument("username", nargs="?", default="admin")
        parser.add_argument("--role", choices=Role.values, default=Role.ADMIN, help="the token's role")
        parser.add_argument(
            "--ttl-seconds", type=int, default=30 * 24 * 3600, help="the token's lifetime (1 h to 1 year)"
        )
        parser.add_argument("--token-name", default="launcher")

    def handle(self, *args, **options):
        ttl = options["ttl_seconds"]
        if not MIN_TTL_SECONDS <= ttl <= MAX_TTL_SECONDS:
            self.stderr.write("--ttl-seconds must be between 3600 and one year")
            raise SystemExit(2)
        user_model = get_user_model()
        password = secrets.token_urlsafe(12)
        user, _ = user_model.objects.get_or_create(username=options["username"])
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        issued = api_token_create(
            user=user,
            name=options["token_name"],
            role=options["role"],
            ttl_seconds=ttl,
            actor="manage.py create_operator",
            actor_role="superuser",
        )
        self.stdout.write(f"username={user.username} password={password} token={issued.token}")
