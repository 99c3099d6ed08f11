"""Operator API tokens: named, role-scoped, expiring, stored only as digests (``docs/operators.md``).

The token itself exists once, in the answer that creates it (``actions.tokens.api_token_create``).
The row keeps django-rest-knox's SHA-512 digest and the first 15 characters (``token_key``, the
lookup index); knox's ``TokenAuthentication`` finds a row by that key and compares digests in
constant time. Revoking a token deletes its row; the audit log keeps the fact.
"""

from __future__ import annotations

from django.db import models
from knox.models import AbstractAuthToken

from core.lookups import one_of

from .roles import Role


class ApiToken(AbstractAuthToken):
    name = models.CharField(max_length=64, help_text="what the token is for, e.g. 'ci-deploy'")
    role = models.CharField(
        max_length=16, choices=Role.choices, help_text="the token acts with at most this role's permissions"
    )

    class Meta:
        ordering = ["-created"]
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(condition=one_of("role", Role.values), name="api_token_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"
