"""Masking secret environment values in job output (docs/logs.md, Secrets): the rule the agent
applies before it sends a log chunk and the control plane applies again before it stores one.

A secret is the value of an ``env`` variable the revision names in ``secretEnv``, at least
:data:`MIN_SECRET_CHARS` characters long; every occurrence becomes :data:`MASK`. Output arrives
in pieces, so a stream's masker holds back the end of what it has seen when that end could be the
start of a secret (at most the longest secret's length − 1 bytes) until the next piece or the
end of the stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: What a masked secret value becomes in the stored log.
MASK = b"[MASKED]"
#: Secret values shorter than this are not masked (masking "1" would garble every log).
MIN_SECRET_CHARS = 4


def secret_values(env: Mapping[str, str], names: Iterable[str]) -> list[bytes]:
    """The UTF-8 values of the ``env`` variables named secret, longest first (so that a secret
    containing another is masked whole)."""
    values = {env[name].encode("utf-8") for name in names if len(env.get(name, "")) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def mask(data: bytes, secrets: list[bytes]) -> bytes:
    """``data`` with every occurrence of each secret value (longest first) replaced by :data:`MASK`."""
    for value in secrets:
        if value in data:
            data = data.replace(value, MASK)
    return data


def held_back(data: bytes, secrets: list[bytes]) -> int:
    """How many bytes at the end of ``data`` could be the start of a secret (the longest such
    suffix, shorter than the secret): what a stream's masker keeps until more arrives."""
    longest = 0
    for value in secrets:
        for size in range(min(len(value) - 1, len(data)), longest, -1):
            if data.endswith(value[:size]):
                longest = size
                break
    return longest


def straddling(tail: bytes, data: bytes, secrets: list[bytes]) -> tuple[int, int]:
    """A secret that begins in ``tail`` (the end of what was already passed on) and ends in
    ``data``: ``(bytes of tail it covers, bytes of data it covers)``, the earliest such
    occurrence; ``(0, 0)`` when there is none."""
    best = (0, 0)
    for value in secrets:
        for covered in range(min(len(value) - 1, len(tail)), 0, -1):
            rest = len(value) - covered
            if tail.endswith(value[:covered]) and data.startswith(value[covered:]) and rest <= len(data):
                if covered > best[0]:
                    best = (covered, rest)
                break
    return best


class StreamMasker:
    """Masks one stream that arrives in pieces: :meth:`feed` returns the masked bytes that are
    safe to pass on and keeps a possible secret's beginning (≤ longest secret − 1 bytes);
    :meth:`flush` returns what was kept (the stream ended)."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = secrets
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        if not self.secrets:
            return data
        masked = mask(self._held + data, self.secrets)
        keep = held_back(masked, self.secrets)
        self._held = masked[len(masked) - keep :] if keep else b""
        return masked[: len(masked) - keep]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held
