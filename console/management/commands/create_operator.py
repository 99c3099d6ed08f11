"""Create (or reset) a staff superuser with a random password and an API token; print both."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Create or reset an operator login and API token (printed once)."

    def add_arguments(self, parser):
        parser.add_argument("username", nargs="?", default="admin")

    def handle(self, *args, **options):
        user_model = get_user_model()
        password = secrets.token_urlsafe(12)
        user, _ = user_model.objects.get_or_create(username=options["username"])
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        Token.objects.filter(user=user).delete()
        token = Token.objects.create(user=user)
        self.stdout.write(f"username={user.username} password={password} token={token.key}")
