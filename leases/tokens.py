"""Lease fencing tokens: worker-generated, high-entropy, stored only as a digest (ADR-0012 §3).

The worker generates a token of at least 128 bits per offer (``secrets.token_urlsafe(32)`` in
the agent: 256 bits) and presents it on every call about that lease. The control plane keeps
SHA-256 over a domain-separation prefix and the token, compares digests in constant time, and
never stores, logs or returns the token itself.
"""

from __future__ import annotations

import hashlib
import hmac
import re

TOKEN = re.compile(r"[A-Za-z0-9_-]{22,128}\Z")  # base64url, >= 128 bits
_DOMAIN = b"qinglong-run-lease-token-v1\x00"


def token_digest(token: str) -> str:
    """Lowercase hex SHA-256 of the domain-separated token."""
    return hashlib.sha256(_DOMAIN + token.encode("ascii")).hexdigest()


def token_matches(token: str, digest: str) -> bool:
    """Constant-time comparison of a presented token with a stored digest."""
    return hmac.compare_digest(token_digest(token), digest)
