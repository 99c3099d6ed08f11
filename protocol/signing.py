"""The worker request-signing profile: RFC 9421 HTTP Message Signatures with Ed25519.

Why RFC 9421 and not a bearer or short-lived token: the worker's private key never leaves the
worker machine (enrollment sends only the public key), every request proves possession of it,
and the signature covers the method, path, query and an RFC 9530 ``Content-Digest`` of the body,
so a captured request cannot be replayed elsewhere or with another body, and a nonce plus the
server-side clock window stop it being replayed as is. A bearer token proves none of that, and a
signed short-lived token would still need per-request binding for the body. The signing and
verification mechanics come from the maintained ``http-message-signatures`` package; this module
only fixes the profile.

A request whose headers are spelt exactly as this profile's signer writes them (the agent's,
``protocol.signer``) is verified on a lean path first: the signature base built directly from the
fixed profile and checked with libsodium (PyNaCl), about a tenth of the library's CPU (it parses
each structured header several times; docs/performance.md "Signed HTTP"). The lean path only
ever *accepts*: any other spelling, and any signature it does not accept, goes through the
library exactly as before, which gives the verdict and the error code. libsodium accepts no
Ed25519 signature OpenSSL (the library's backend) refuses, and the base is byte-equal to the
library's (``tests/protocol/test_signer.py``), so the set of accepted requests is the library's.

The profile (a request that deviates from it is ``signature_malformed``)::

    Content-Digest: sha-256=:<base64 sha-256 of the body>:
    Signature-Input: ql=("@method" "@path" "@query" "content-digest");created=<unix s>;
                     keyid="<credential id>";alg="ed25519";nonce="<>=128-bit base64url>";
                     tag="qinglong-worker-v1"
    Signature: ql=:<base64 Ed25519 signature>:
    QL-Target: <METHOD> <path?query>      (unsigned diagnostic: what the worker meant to sign)

``created`` is checked against the *server's* clock (window ``QINGLONG_SIGNATURE_WINDOW_SECONDS``);
nonces are remembered for twice the window (``api.auth``).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import re
import secrets
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import http_sf
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from http_message_signatures import (
    ContentDigest,
    HTTPMessageSigner,
    HTTPMessageVerifier,
    HTTPSignatureKeyResolver,
    InvalidSignature,
)
from http_message_signatures.algorithms import ED25519
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from .errors import ProtocolError
from .signer import ALGORITHM, COVERED_COMPONENTS, LABEL, TAG, TARGET_HEADER

__all__ = ["ALGORITHM", "COVERED_COMPONENTS", "LABEL", "TAG", "TARGET_HEADER"]

NONCE = re.compile(r"[A-Za-z0-9_-]{22,64}\Z")  # >= 128 bits of base64url
KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,80}\Z")
_PARAMS = {"created", "keyid", "alg", "nonce", "tag"}
#: The profile's headers exactly as ``protocol.signer`` spells them: the lean path's precondition.
_CANONICAL_INPUT = re.compile(
    LABEL
    + "=("
    + re.escape("(" + " ".join(f'"{c}"' for c in COVERED_COMPONENTS) + ")")
    + r';created=([1-9][0-9]{0,14});keyid="([A-Za-z0-9_.-]{1,80})";alg="'
    + ALGORITHM
    + r'";nonce="([A-Za-z0-9_-]{22,64})";tag="'
    + TAG
    + r'")\Z'
)
_CANONICAL_SIGNATURE = re.compile(LABEL + r"=:([A-Za-z0-9+/]{86}==):\Z")
#: A path and query the library takes as they are (no space, fragment or control character; a
#: ``%`` only as a percent-encoded octet, as the library requires).
_PLAIN_TARGET = re.compile(
    r"(/(?:[A-Za-z0-9/._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)"
    r"(?:\?((?:[A-Za-z0-9/._~!$&'()*+,;=:@?-]|%[0-9A-Fa-f]{2})*))?\Z"
)
#: Placeholder authority: ``@authority`` is not covered (proxies rewrite Host), so any fixed host works.
_AUTHORITY = "https://worker.invalid"


@dataclass
class Message:
    """The minimal request shape ``http-message-signatures`` reads: method, absolute URL, headers."""

    method: str
    url: str
    headers: MutableMapping[str, str] = field(default_factory=dict)


class _OneKey(HTTPSignatureKeyResolver):
    def __init__(self, key: Ed25519PrivateKey | Ed25519PublicKey) -> None:
        self.key = key

    def resolve_private_key(self, key_id: str) -> Ed25519PrivateKey:
        return self.key  # type: ignore[return-value]

    def resolve_public_key(self, key_id: str) -> Ed25519PublicKey:
        return self.key  # type: ignore[return-value]


class _Verifier(HTTPMessageVerifier):
    # The creation window is enforced by verify_request() with the server's clock and a distinct
    # error code; the library's own skew check must never be the stricter of the two.
    max_clock_skew = datetime.timedelta(days=3650)


def public_key_text(key: Ed25519PublicKey) -> str:
    """Raw 32-byte Ed25519 public key as unpadded base64url, 43 characters (what enrollment sends)."""
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


_PUBLIC_KEY_TEXT = re.compile(r"[A-Za-z0-9_-]{43}=?\Z")


def load_public_key(text: str) -> Ed25519PublicKey:
    """Inverse of :func:`public_key_text` (one trailing ``=`` tolerated).

    Strict: exactly the canonical encoding of 32 bytes, so one key has one spelling and a
    "key already used" check cannot be dodged by respelling it (Python's base64 decoder would
    otherwise skip stray characters). Raises ProtocolError ``validation_failed`` naming
    ``publicKey``.
    """
    if not isinstance(text, str) or not _PUBLIC_KEY_TEXT.match(text):
        raise ProtocolError(
            "validation_failed", "must be a raw Ed25519 public key, 43 characters of base64url", "publicKey"
        )
    try:
        raw = base64.urlsafe_b64decode(text.rstrip("=") + "=")
        key = Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, TypeError):
        raise ProtocolError("validation_failed", "must be a raw Ed25519 public key", "publicKey") from None
    if public_key_text(key) != text.rstrip("="):
        raise ProtocolError("validation_failed", "not the canonical base64url of the key", "publicKey")
    return key


def new_nonce() -> str:
    """A fresh 128-bit nonce, base64url."""
    return secrets.token_urlsafe(16)


def sign_request(
    *,
    method: str,
    path: str,
    body: bytes,
    key_id: str,
    private_key: Ed25519PrivateKey,
    created: datetime.datetime | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Return the headers that sign ``method path`` with ``body`` under this profile.

    ``path`` is the request target (path plus optional ``?query``); ``created`` defaults to now.
    """
    message = Message(method=method.upper(), url=_AUTHORITY + path)
    HTTPMessageSigner(signature_algorithm=ED25519, key_resolver=_OneKey(private_key)).sign(
        message,
        key_id=key_id,
        created=created or datetime.datetime.now(datetime.UTC),
        nonce=nonce or new_nonce(),
        label=LABEL,
        tag=TAG,
        covered_component_ids=COVERED_COMPONENTS,
        body=body,
    )
    message.headers[TARGET_HEADER] = f"{method.upper()} {path}"
    return dict(message.headers)


@dataclass(frozen=True)
class SignedRequest:
    """What a verified signature established: the key id, its nonce and creation time (unix s)."""

    key_id: str
    nonce: str
    created: int


def parse_signature_input(headers: MutableMapping[str, str]) -> SignedRequest:
    """Check the headers follow the profile; return key id, nonce and created without verifying.

    Raises ProtocolError ``signature_missing`` or ``signature_malformed``.
    """
    signature_input = headers.get("Signature-Input")
    if not signature_input or not headers.get("Signature"):
        raise ProtocolError("signature_missing", "Signature and Signature-Input headers are required")
    try:
        parsed = http_sf.parse(signature_input.encode("ascii"), tltype="dictionary")
    except Exception:  # http_sf raises ValueError/UnicodeError subclasses on malformed input
        raise ProtocolError("signature_malformed", "Signature-Input is not a structured dictionary") from None
    if not isinstance(parsed, dict) or list(parsed) != [LABEL]:
        raise ProtocolError("signature_malformed", f"exactly one signature labelled {LABEL!r} is required")
    member = parsed[LABEL]  # an inner list is (items, params); each item is (value, params)
    covers = f"the signature must cover {' '.join(COVERED_COMPONENTS)}"
    if not isinstance(member, tuple) or not isinstance(member[0], list):
        raise ProtocolError("signature_malformed", covers)
    components, params = member[0], member[1]
    if tuple(item[0] if isinstance(item, tuple) else item for item in components) != COVERED_COMPONENTS:
        raise ProtocolError("signature_malformed", covers)
    if set(params) != _PARAMS:
        raise ProtocolError("signature_malformed", f"signature parameters must be exactly {sorted(_PARAMS)}")
    if params["alg"] != ALGORITHM or params["tag"] != TAG:
        raise ProtocolError("signature_malformed", f"alg must be {ALGORITHM!r} and tag {TAG!r}")
    created, key_id, nonce = params["created"], params["keyid"], params["nonce"]
    if type(created) is not int or not isinstance(key_id, str) or not KEY_ID.match(key_id):
        raise ProtocolError("signature_malformed", "created must be an integer and keyid a credential id")
    if not isinstance(nonce, str) or not NONCE.match(nonce):
        raise ProtocolError("signature_malformed", "nonce must be at least 128 bits of base64url")
    return SignedRequest(key_id=key_id, nonce=nonce, created=created)


def verify_request(
    *,
    method: str,
    path: str,
    headers: MutableMapping[str, str],
    body: bytes,
    now: float,
    window_seconds: int,
    resolve_key: Callable[[str], Ed25519PublicKey],
    future_skew_seconds: int | None = None,
) -> SignedRequest:
    """Verify a worker request against the profile; return what it proves.

    The clock window is asymmetric: ``created`` may lie up to ``window_seconds`` in the past and
    up to ``future_skew_seconds`` (default: the whole window) in the future of the server's
    ``now``. Order: profile shape, clock window (server ``now``, unix seconds), key resolution
    (``resolve_key`` raises ProtocolError for unknown/revoked credentials), body digest, then the
    Ed25519 signature over method, path, query and digest. Nonce uniqueness is the caller's.

    Raises ProtocolError: ``signature_missing``, ``signature_malformed``, ``signature_stale``,
    ``content_digest_mismatch``, ``signature_path_mismatch``, ``signature_invalid`` or whatever
    ``resolve_key`` raises.
    """
    canonical = _canonical_input(headers)
    signed = canonical[0] if canonical else parse_signature_input(headers)
    ahead = window_seconds if future_skew_seconds is None else future_skew_seconds
    if not now - window_seconds <= signed.created <= now + ahead:
        raise ProtocolError(
            "signature_stale", f"signature created {int(signed.created - now)} s from server time"
        )
    public_key = resolve_key(signed.key_id)
    if canonical and _lean_verified(canonical[1], method, path, headers, body, public_key):
        return signed
    digest = headers.get("Content-Digest")
    if not digest:
        raise ProtocolError("signature_malformed", "Content-Digest header is required")
    try:
        ContentDigest.verify(digest, body)
    except Exception:
        raise ProtocolError("content_digest_mismatch", "the body does not match Content-Digest") from None
    verifier = _Verifier(signature_algorithm=ED25519, key_resolver=_OneKey(public_key))
    try:
        verifier.verify(
            Message(method=method, url=_AUTHORITY + path, headers=headers),
            max_age=None,
            expect_tag=TAG,
            require_components=COVERED_COMPONENTS,
            body=body,
        )
    except InvalidSignature:
        if _signed_for_other_target(verifier, method, path, headers, body):
            raise ProtocolError(
                "signature_path_mismatch", "the request was signed for another target"
            ) from None
        raise ProtocolError("signature_invalid", "the signature does not verify") from None
    return signed


def _canonical_input(headers: MutableMapping[str, str]) -> tuple[SignedRequest, str] | None:
    """The request's signature parameters and its ``@signature-params`` value when Signature-Input
    is spelt exactly as the profile's signer writes it; None for any other spelling."""
    found = _CANONICAL_INPUT.match(headers.get("Signature-Input") or "")
    if found is None:
        return None
    params, created, key_id, nonce = found.groups()
    return SignedRequest(key_id=key_id, nonce=nonce, created=int(created)), params


def _lean_signature_base(
    params: str, method: str, path: str, headers: MutableMapping[str, str], body: bytes
) -> bytes | None:
    """The signature base the library would build, for a plain POST target whose Content-Digest
    is the body's as the profile spells it; None for anything else (then the library decides).
    ``params``: the ``@signature-params`` value from :func:`_canonical_input`."""
    target = _PLAIN_TARGET.match(path)
    digest = "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode("ascii") + ":"
    if target is None or method != "POST" or headers.get("Content-Digest") != digest:
        return None
    return (
        f'"@method": {method}\n"@path": {target.group(1)}\n"@query": ?{target.group(2) or ""}\n'
        f'"content-digest": {digest}\n"@signature-params": {params}'
    ).encode("ascii")


def _lean_verified(
    params: str,
    method: str,
    path: str,
    headers: MutableMapping[str, str],
    body: bytes,
    public_key: Ed25519PublicKey,
) -> bool:
    """True when the signature verifies on the lean path; False means "ask the library", never
    "refused"."""
    signature = _CANONICAL_SIGNATURE.match(headers.get("Signature") or "")
    base = _lean_signature_base(params, method, path, headers, body)
    if signature is None or base is None:
        return False
    raw_signature = base64.b64decode(signature.group(1))
    if base64.b64encode(raw_signature).decode("ascii") != signature.group(1):
        return False  # stray bits in the last character: the library's parser judges that
    try:
        crypto_sign_open(raw_signature + base, public_key.public_bytes_raw())
    except BadSignatureError:
        return False
    return True


def _signed_for_other_target(
    verifier: HTTPMessageVerifier, method: str, path: str, headers: MutableMapping[str, str], body: bytes
) -> bool:
    """Whether the signature verifies for the target the worker says it signed (QL-Target)."""
    claimed = headers.get(TARGET_HEADER, "")
    claimed_method, _, claimed_path = claimed.partition(" ")
    if not claimed_path.startswith("/") or (claimed_method, claimed_path) == (method, path):
        return False
    if urlsplit(claimed_path).netloc:
        return False
    try:
        verifier.verify(
            Message(method=claimed_method, url=_AUTHORITY + claimed_path, headers=headers),
            max_age=None,
            expect_tag=TAG,
            require_components=COVERED_COMPONENTS,
            body=body,
        )
    except Exception:
        return False
    return True
