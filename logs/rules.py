"""Pure rules of the stored log (docs/logs.md): secret masking and marker lines.

A marker is a line the control plane writes into the stored log itself, so that a reader sees
what is missing: a gap (bytes the agent dropped or chunks that never arrived) or the truncation
at the per-attempt cap. Markers start on a line of their own.
"""

from __future__ import annotations

from protocol import globs as globs_rule
from protocol.masking import MASK as MASK
from protocol.masking import MIN_SECRET_CHARS as MIN_SECRET_CHARS
from protocol.masking import mask as mask
from protocol.masking import secret_values as secret_values


def marker(text: str, *, at_line_start: bool) -> bytes:
    """One marker line, ``[qinglong] text``, preceded by a newline unless already at a line start."""
    line = f"[qinglong] {text}\n".encode()
    return line if at_line_start else b"\n" + line


def gap_marker(stream: str, missing: int, *, at_line_start: bool) -> bytes:
    """The marker for ``missing`` bytes of ``stream`` that never reached the control plane."""
    return marker(
        f"gap: {missing} bytes of {stream} were lost before they reached the control plane",
        at_line_start=at_line_start,
    )


def sequence_gap_marker(first: int, last: int, *, at_line_start: bool) -> bytes:
    """The marker for chunks ``first``…``last`` that never arrived."""
    which = f"chunk {first}" if first == last else f"chunks {first}-{last}"
    return marker(f"gap: log {which} never arrived", at_line_start=at_line_start)


def truncation_marker(limit: int, *, at_line_start: bool) -> bytes:
    """The marker written once when an attempt's log reaches its cap of ``limit`` bytes."""
    return marker(
        f"log truncated: this attempt reached the cap of {limit} bytes", at_line_start=at_line_start
    )


def utf8_cut(data: bytes, cut: int) -> int:
    """Where to cut ``data`` at most ``cut`` bytes in so that no UTF-8 character is split: ``cut``
    itself, or the start of the character it falls inside (at most 3 bytes earlier) when the
    bytes there are one valid UTF-8 character. Bytes that are not valid UTF-8 there are cut at
    ``cut`` (the log is bytes; nothing is dropped for a character that is not one)."""
    if cut <= 0 or cut >= len(data) or data[cut] & 0xC0 != 0x80:
        return cut  # not inside a multi-byte character
    for start in range(cut - 1, max(-1, cut - 4), -1):
        lead = data[start]
        if lead & 0xC0 == 0x80:
            continue
        length = 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else 4 if lead & 0xF8 == 0xF0 else 1
        if start + length <= cut:
            return cut
        try:
            data[start : start + length].decode("utf-8")
        except UnicodeDecodeError:
            return cut
        return start
    return cut


def matches_declared(name: str, globs: list[str]) -> bool:
    """Whether the relative ``/``-separated ``name`` matches one of the declared globs
    (``protocol.globs``: ``*`` stays within a segment, ``**`` crosses directories; the agent
    collects by the same rule)."""
    return globs_rule.matches_any(name, globs)


def object_name(attempt_id: object) -> str:
    """Storage name of an attempt's compacted log."""
    return f"logs/{attempt_id}.log"


def artifact_directory(attempt_id: object) -> str:
    """Storage directory of an attempt's artifacts."""
    return f"artifacts/{attempt_id}"


def artifact_object_name(attempt_id: object, artifact_id: int) -> str:
    """Storage name of one artifact (by id: names may hold any characters)."""
    return f"{artifact_directory(attempt_id)}/{artifact_id}"


def mask_text(text: str, env: dict[str, str], names: list[str]) -> str:
    """``text`` with the secret ``env`` values named in ``names`` masked (the output tails a
    completion carries; same rule as the stored log)."""
    for value in sorted(
        (env[n] for n in names if len(env.get(n, "")) >= MIN_SECRET_CHARS), key=len, reverse=True
    ):
        text = text.replace(value, MASK.decode())
    return text
