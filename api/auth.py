"""Worker authentication: RFC 9421 signatures → ``WorkerPrincipal`` (ADR-0012 §1).

``WorkerSignatureAuthentication`` is the only way into the worker API. It verifies the request
against the signing profile (``protocol.signing``), using the *server's* clock for the
``created`` window, resolves the ``keyid`` to a credential (``workers.principals``: active, or
rotated and inside its grace period), and accepts each nonce once (:func:`nonce_accept`).

Nonces are accepted once each. The cluster profile keeps them in Redis (``cache.add`` is
``SET NX``: of two replicas racing with one nonce exactly one wins); the standalone profile keeps
them in its database (``actions.nonces``: insert-or-fail), so a restart forgets none of them and
refuses no fresh request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.core.cache import cache
from rest_framework.authentication import BaseAuthentication

from actions.nonces import nonce_record
from api.ratelimit import WORKER_GROUP, by_address, client_address, enforce, worker_counter
from core.conf import protocol
from core.errors import DomainError
from protocol.errors import ProtocolError
from protocol.signing import SignedRequest, verify_request
from workers.principals import (
    CredentialStamp,
    WorkerPrincipal,
    cache_is_shared,
    resolve_credential,
    trusted_key,
)

log = logging.getLogger("qinglong.auth")

_NONCE_KEY = "worker-nonce:{}:{}"

# --- nonces ------------------------------------------------------------------------------------------


def nonce_accept(*, key_id: str, nonce: str, window_seconds: int) -> None:
    """Accept one (keyid, nonce) pair once within the signature window (ADR-0012 §1 replay limits).

    ``window_seconds``: ``SIGNATURE_WINDOW_SECONDS``. The nonce is kept for twice the window,
    longer than any signature carrying it can be fresh: in Redis (``cache.add``, atomic ``SET
    NX``) when the cache is shared, else in the database (``actions.nonces.nonce_record``,
    insert-or-fail), which survives restarts (docs/transport.md "Nonce store").

    Raises ProtocolError ``signature_replayed``; DomainError ``storage_busy`` (503) when SQLite
    stays locked.
    """
    key = _NONCE_KEY.format(key_id, nonce)
    if cache_is_shared():
        accepted = cache.add(key, 1, timeout=2 * window_seconds)
    else:
        accepted = nonce_record(key=key, ttl_seconds=2 * window_seconds)
    if not accepted:
        raise ProtocolError("signature_replayed", "this signature nonce was already used")


def nonce_accept_and_count(
    *,
    key_id: str,
    nonce: str,
    window_seconds: int,
    worker_id: str,
    group: str,
    rate: str,
    raw,
    stamp: CredentialStamp | None = None,
    recheck: Callable[[], None] | None = None,
) -> bool:
    """Shared cache only: accept the nonce and count the worker's request in one Redis round trip.

    The nonce is kept as :func:`nonce_accept` keeps it; only when it is fresh is the request
    counted into the worker's rate-limit window of the view's bucket ``group`` at ``rate``
    (``api.ratelimit.worker_counter``, the counter ``WorkerAPIView`` would otherwise count with
    ``enforce``), and the usage is left on ``raw``
    for ``WorkerAPIView.initial`` to judge. With ``stamp`` (a credential read from this process's
    memory) the same round trip reads the credential's version; when it moved, ``recheck`` runs
    first (it judges the credential again and raises its refusal), so a revocation made on any
    replica is refused here as if nothing had been kept in memory. Returns False (nothing done)
    when the cache offers no combined call. Raises ProtocolError ``signature_replayed`` or
    whatever ``recheck`` raises.
    """
    add_and_count = getattr(cache, "add_count_and_read", None)
    if add_and_count is None or not cache_is_shared():
        return False
    counter, lifetime, limit, window = worker_counter(worker_id, rate, group)
    count, version = add_and_count(
        _NONCE_KEY.format(key_id, nonce),
        2 * window_seconds,
        counter,
        lifetime,
        None if stamp is None else stamp.version_key,
    )
    if stamp is not None and recheck is not None and not stamp.current(version):
        recheck()
    if count is None:
        raise ProtocolError("signature_replayed", "this signature nonce was already used")
    raw.worker_usage = {"count": count, "limit": limit, "time_left": window - int(time.time())}
    return True


# --- the DRF authentication class ------------------------------------------------------------------


class WorkerSignatureAuthentication(BaseAuthentication):
    """DRF authentication for worker endpoints. Sets ``request.user`` to a ``WorkerPrincipal``.

    Raises ProtocolError (mapped to 401 by the API exception handler) with ``signature_missing``,
    ``signature_malformed``, ``signature_stale``, ``credential_unknown``, ``credential_revoked``,
    ``credential_expired``, ``content_digest_mismatch``, ``signature_path_mismatch``,
    ``signature_invalid`` or ``signature_replayed``; DomainError ``storage_busy`` (503) and
    ``rate_limited`` (429) instead of the failure once a client address has failed
    authentication more than ``RATE_AUTH_FAILURES`` times. Only failing requests are counted and
    limited: a correctly signed request is never refused by this limit, so a forger sharing a
    worker's address (NAT, same host) cannot lock it out.
    """

    def authenticate(self, request) -> tuple[WorkerPrincipal, SignedRequest]:
        return self.authenticate_raw(request._request, request.parser_context.get("view"))

    def authenticate_raw(self, raw, view=None) -> tuple[WorkerPrincipal, SignedRequest]:
        """:meth:`authenticate` on Django's request ``raw`` for ``view`` (its rate bucket): the
        worker endpoints that skip DRF's dispatch (``api.hot``) authenticate here. Raises what
        :meth:`authenticate` raises."""
        # Only failures count, and only a failing request is answered 429: a correctly signed
        # request always passes, so a forger sharing a worker's address cannot lock it out.
        try:
            return self._authenticate(raw, view)
        except (ProtocolError, DomainError) as exc:
            log.warning(
                "worker request refused: %s (%s %s from %s)",
                exc.code,
                raw.method,
                raw.path,
                client_address(raw),
            )
            if exc.code != "storage_busy":
                enforce(  # counts this failure; the next over the limit gets 429
                    raw,
                    group="worker-auth-failures",
                    key=by_address,
                    rate=protocol().rate_auth_failures,
                    message="too many failed worker authentications from this address",
                )
            raise

    def _authenticate(self, raw, view=None, *, local: bool = True) -> tuple[WorkerPrincipal, SignedRequest]:
        """``local``: the credential may come from this process's memory (``workers.principals``);
        a request refused after such a credential verified the key is judged again without it,
        so every refusal is the one the shared stores give."""
        now = time.time()
        window = protocol().signature_window_seconds
        resolved: dict[str, WorkerPrincipal] = {}
        stamps: list[CredentialStamp] = []

        def resolve_key(key_id: str):
            resolved["principal"], public_key, stamp = resolve_credential(key_id, now=now, local=local)
            if stamp is not None:
                stamps.append(stamp)
            try:
                return trusted_key(public_key)
            except ProtocolError:  # stored before keys were vetted: never trust it
                raise ProtocolError(
                    "signature_invalid", "the credential's public key is not usable"
                ) from None

        try:
            signed = verify_request(
                method=raw.method,
                path=raw.get_full_path(),
                headers=raw.headers,
                body=raw.body,
                now=now,
                window_seconds=window,
                future_skew_seconds=protocol().signature_future_skew_seconds,
                resolve_key=resolve_key,
            )
        except ProtocolError:
            if stamps:  # the copy in memory may be stale: the shared stores decide the refusal
                return self._authenticate(raw, view, local=False)
            raise

        def recheck() -> None:  # the credential changed since it was read: judge it afresh
            resolved["principal"] = resolve_credential(signed.key_id, now=now)[0]

        # Remember the nonce only after the signature verified, so forged requests cannot burn
        # a worker's nonces. With Redis, the worker's rate-limit count rides the same round trip.
        principal = resolved["principal"]
        if not nonce_accept_and_count(
            key_id=signed.key_id,
            nonce=signed.nonce,
            window_seconds=window,
            worker_id=str(principal.worker_id),
            group=getattr(view, "rate_group", WORKER_GROUP),
            rate=view.rate() if hasattr(view, "rate") else protocol().rate_worker,
            raw=raw,
            stamp=stamps[0] if stamps else None,
            recheck=recheck,
        ):
            nonce_accept(key_id=signed.key_id, nonce=signed.nonce, window_seconds=window)
        return resolved["principal"], signed

    def authenticate_header(self, request) -> str:
        return 'Signature realm="qinglong-worker", alg="ed25519"'
