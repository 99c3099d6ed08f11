"""Lease fencing tokens: worker-generated, high-entropy, stored only as a digest (ADR-0012 §3).

The worker generates a token of at least 128 bits per offer (``secrets.token_urlsafe(32)`` in
the agent: 256 bits) and presents it on every call about that lease. The control plane keeps
SHA-256 over a domain-separation prefix, the worker's id and the token, compares digests in
constant time, and never stores, logs or returns the token itself (docs/placement.md §5).

Binding the digest to the worker id means two workers can never collide on a digest, even if
they present the same token: the unique index on the digest can then only be hit by one worker
reusing its own token, and that worker's claims are serialised by its row lock, where the claim
refuses the reuse with a clear ``lease_offer_conflict`` instead of an integrity error.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid

TOKEN = re.compile(r"[A-Za-z0-9_-]{22,128}\Z")  # base64url, >= 128 bits
_DOMAIN = b"qinglong-run-lease-token-v1\x00"


def token_digest(token: str, *, worker_id: uuid.UUID) -> str:
    """Lowercase hex SHA-256 of the domain-separated (worker id, token) pair.

    ``token``: the base64url text the worker sent (``TOKEN`` validates it at the edge; any other
    text simply never matches).
    """
    return hashlib.sha256(_DOMAIN + worker_id.bytes + token.encode("utf-8", "surrogatepass")).hexdigest()


def token_matches(token: str, digest: str, *, worker_id: uuid.UUID) -> bool:
    """Constant-time comparison of a presented token with a stored digest."""
    return hmac.compare_digest(token_digest(token, worker_id=worker_id), digest)
