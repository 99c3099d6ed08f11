"""Which Ed25519 public keys the control plane accepts as a worker's key (ADR-0012 §1).

``protocol.signing.load_public_key`` checks the wire spelling (32 bytes, canonical base64url).
That is not enough for a key the server will trust: RFC 8032 verification as OpenSSL implements
it accepts a *small-order* public key — the identity point, or one of the other seven points of
order dividing 8 — and for such a key a signature with ``R`` of small order and ``S = 0``
verifies for every message. A worker enrolled with one could then be impersonated by anyone,
without any private key. So the control plane also requires the key to be a canonical point of
the prime-order subgroup, as every honestly generated key is, using libsodium's
``crypto_core_ed25519_is_valid_point`` (canonical encoding, on the curve, not of small order,
in the main subgroup) through PyNaCl.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from nacl.bindings import crypto_core_ed25519_is_valid_point

from protocol.errors import ProtocolError
from protocol.signing import load_public_key


def worker_public_key(text: str) -> Ed25519PublicKey:
    """Parse and vet a worker's public key from its wire text.

    ``text``: 43 characters of unpadded base64url (one trailing ``=`` tolerated), the raw
    32-byte Ed25519 public key. Returns the key. Raises ProtocolError ``validation_failed``
    naming ``publicKey`` when the spelling is not canonical or the point is not a usable key
    (small order, outside the prime-order subgroup, not on the curve).
    """
    key = load_public_key(text)
    if not crypto_core_ed25519_is_valid_point(key.public_bytes(Encoding.Raw, PublicFormat.Raw)):
        raise ProtocolError(
            "validation_failed",
            "not a usable Ed25519 public key (a small-order or mixed-order point, for which "
            "signatures can be forged without the private key)",
            "publicKey",
        )
    return key
