"""Operator API tokens: create (shown once) and revoke (``docs/operators.md`` Tokens).

A token is ``qlops_`` + 256 random bits (django-rest-knox); the database keeps only its SHA-512
digest, so no page and no query can show it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from knox.models import get_token_model

from accounts.models import ApiToken
from accounts.roles import Role, holds_role
from audit.models import ActorType
from audit.recorder import record
from core.db import write_path
from core.errors import DomainError

#: Bounds of a token's lifetime, seconds.
MIN_TTL_SECONDS = 3600
MAX_TTL_SECONDS = 365 * 24 * 3600


@dataclass(frozen=True)
class IssuedApiToken:
    """A freshly created API token. ``token`` exists only here; show it once."""

    token: str
    record: ApiToken


@write_path
def api_token_create(
    *, user, name: str, role: str, ttl_seconds: int, actor: str = "", actor_role: str = ""
) -> IssuedApiToken:
    """Create an API token for ``user`` scoped to ``role`` (viewer, operator or admin).

    ``name``: 1–64 characters saying what it is for; ``ttl_seconds``: lifetime, one hour to a
    year. The role may not exceed what the user holds (a token never widens its user's rights).
    ``actor``/``actor_role``: who creates it, for the audit row. Writes the token row (digest
    only) and an ``api_token.created`` event. Raises ``validation_failed`` (``name``, ``role``,
    ``ttlSeconds``).
    """
    name = name.strip()
    if not 1 <= len(name) <= 64:
        raise DomainError("validation_failed", "must be 1 to 64 characters", field="name")
    if role not in Role.values:
        raise DomainError("validation_failed", f"must be one of {', '.join(Role.values)}", field="role")
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise DomainError("validation_failed", "must be between one hour and one year", field="ttlSeconds")
    if not holds_role(user, role):
        raise DomainError(
            "validation_failed", f"{user.get_username()} does not hold the {role} role", field="role"
        )
    instance, token = get_token_model().objects.create(
        user=user, expiry=timedelta(seconds=ttl_seconds), name=name, role=role
    )
    record(
        "api_token.created",
        actor_type=ActorType.OPERATOR,
        actor=actor,
        data={"for": user.get_username()[:64], "token_role": role, "ttl_s": ttl_seconds, "role": actor_role},
    )
    return IssuedApiToken(token=token, record=instance)


@write_path
def api_token_revoke(*, digest: str, actor: str = "", actor_role: str = "") -> bool:
    """Revoke one API token by its digest: the row is deleted, so the next request with the
    token is refused (``not_authenticated``). Writes an ``api_token.revoked`` event. Returns
    False (and writes nothing) if no such token exists."""
    token = ApiToken.objects.filter(digest=digest).select_related("user").first()
    if token is None:
        return False
    ApiToken.objects.filter(digest=digest).delete()
    record(
        "api_token.revoked",
        actor_type=ActorType.OPERATOR,
        actor=actor,
        data={"for": token.user.get_username()[:64], "token_role": token.role, "role": actor_role},
    )
    return True
