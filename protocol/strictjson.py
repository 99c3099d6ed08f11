"""Strict JSON parsing for every body the control plane accepts (ADR-0012 §1, §4).

``json.loads`` alone accepts duplicate keys (last wins), ``NaN``/``Infinity``, numbers that
overflow to infinity, lone UTF-16 surrogates and recursion deep enough to raise RecursionError.
:func:`loads` refuses all of them with a :class:`~protocol.errors.ProtocolError` whose ``field``
is the JSON path of the offending value (``capabilities.labels.zone``, ``gpus[1].memoryMiB``),
so the API can answer a 400 naming it:

=========================== ============================================================
code                        refused input
=========================== ============================================================
``json_malformed``          not UTF-8, not JSON (path of the value being read when it broke)
``json_too_deep``           objects/arrays nested deeper than ``max_depth`` (path of the
                            container that crosses the limit)
``json_duplicate_key``      an object repeating a key (path of the repeated key)
``json_number_out_of_range`` ``NaN``, ``Infinity``, a float beyond the IEEE double range
                            (``1e400``), an integer of more than 19 digits
``json_invalid_string``     a lone surrogate (escaped ``\\ud800`` or raw) or a raw control
                            character inside a string
=========================== ============================================================

Nesting is checked by a linear pre-scan *before* ``json.loads`` runs, so a 1,000-deep or
1,000,000-deep document costs one pass over its text and never recurses. The same scanner
names the path of a malformed spot, so every refusal names a field where one exists.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import ProtocolError, join_path

#: Default maximum nesting of objects/arrays (a capability snapshot needs 4).
DEFAULT_MAX_DEPTH = 8
#: Integers longer than this many digits are refused (beyond any bounded field of the protocol).
MAX_INT_DIGITS = 19
#: Longest object key shown in an error's field path (longer keys are cut and marked with …).
MAX_PATH_KEY = 64

_SURROGATE = re.compile("[\ud800-\udfff]")
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def display_key(key: Any) -> str:
    """An object key as it may appear in an error's ``field`` path.

    Control characters and lone surrogates are written as ``\\uXXXX`` (a lone surrogate could
    not even be encoded in the UTF-8 error answer), keys longer than :data:`MAX_PATH_KEY`
    characters are cut, and the empty key is shown as ``""``, so echoing a hostile key back is
    always safe, bounded and visible.
    ADR-0012 §4.
    """
    text = key if isinstance(key, str) else repr(key)
    if not text:
        return '""'
    if len(text) > MAX_PATH_KEY:
        text = text[:MAX_PATH_KEY] + "…"
    return _UNPRINTABLE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


class _Bad:
    """Marker left in the parsed tree where a refused literal stood; reported with its path."""

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message


class _Duplicate(dict[str, Any]):
    """An object that repeated a key; the key is reported with its own path."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.duplicate_key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Duplicate(pairs, key)
        seen.add(key)
    return dict(pairs)


def _float(text: str) -> Any:
    value = float(text)
    if math.isinf(value):
        return _Bad("json_number_out_of_range", f"number {text[:32]} is beyond the IEEE double range")
    return value


def _int(text: str) -> Any:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return _Bad("json_number_out_of_range", f"integer with {len(text)} digits is out of range")
    return int(text)


def _constant(text: str) -> Any:
    return _Bad("json_number_out_of_range", f"{text} is not a JSON number")


class _Frame:
    """One open object or array during the scan: where the scanner is inside it."""

    __slots__ = ("is_object", "key", "index", "expect_key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.key: str | None = None  # object: the key whose value is being read
        self.index = 0  # array: the element being read
        self.expect_key = is_object  # object: the next string is a key


def _path(frames: list[_Frame]) -> str | None:
    path: str | None = None
    for frame in frames:
        if frame.is_object:
            if frame.key is None or frame.expect_key:
                break  # between members: the object itself is the place
            path = join_path(path, display_key(frame.key))
        else:
            path = join_path(path, frame.index)
    return path


def _decode_key(raw: str) -> str:
    try:
        decoded: str = json.loads(f'"{raw}"')  # a JSON string literal decodes to a str
        return decoded
    except ValueError:
        return raw


#: The tokens that matter for paths: whole strings (escapes included), an unterminated string,
#: and the structural characters. Everything else (numbers, literals, whitespace) is skipped.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[\]{}:,]', re.DOTALL)


def _scan(text: str, *, max_depth: int, stop: int | None = None) -> str | None:
    """Walk ``text`` once, tracking the JSON path; never recurses (ADR-0012 §4).

    Raises ``json_too_deep`` (with the path of the container crossing ``max_depth``). With
    ``stop``, returns the path of the value being read at character offset ``stop``.
    """
    frames: list[_Frame] = []
    end = len(text) if stop is None else min(stop, len(text))
    for token in _TOKEN.finditer(text, 0, len(text)):
        if token.start() >= end:
            break
        char = token.group()
        if char[0] == '"':
            if len(char) == 1 or token.end() > end:
                return _path(frames)  # an unterminated string, or stopped inside this one
            if frames and frames[-1].is_object and frames[-1].expect_key:
                frames[-1].key = _decode_key(char[1:-1])
        elif char in "[{":
            if len(frames) >= max_depth:
                raise ProtocolError("json_too_deep", f"nesting deeper than {max_depth} levels", _path(frames))
            frames.append(_Frame(is_object=char == "{"))
        elif char in "]}":
            if frames:
                frames.pop()
        elif char == ":":
            if frames and frames[-1].is_object:
                frames[-1].expect_key = False
        elif frames:  # ","
            if frames[-1].is_object:
                frames[-1].expect_key = True
            else:
                frames[-1].index += 1
    return _path(frames) if stop is not None else None


def check_depth(text: str, max_depth: int) -> None:
    """Raise ``json_too_deep`` naming the path if arrays/objects nest deeper than ``max_depth``.

    Linear in ``len(text)``; no recursion whatever the nesting.
    ADR-0012 §4.
    """
    if text.count("{") + text.count("[") <= max_depth:
        return  # no more brackets in all than the limit (those in strings too): none nests deeper
    _scan(text, max_depth=max_depth)


def _walk(node: Any, path: str | None) -> None:
    # Depth is bounded by the pre-scan, so this recursion is too.
    if isinstance(node, _Bad):
        raise ProtocolError(node.code, node.message, path)
    if isinstance(node, dict):
        if isinstance(node, _Duplicate):
            raise ProtocolError(
                "json_duplicate_key",
                f"key {display_key(node.duplicate_key)!r} appears more than once",
                join_path(path, display_key(node.duplicate_key)),
            )
        for key, value in node.items():
            if _SURROGATE.search(key):
                raise ProtocolError(
                    "json_invalid_string",
                    "object key holds a lone surrogate",
                    join_path(path, display_key(key)),
                )
            _walk(value, join_path(path, display_key(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _walk(value, join_path(path, index))
    elif isinstance(node, str) and _SURROGATE.search(node):
        raise ProtocolError("json_invalid_string", "string holds a lone UTF-16 surrogate", path)


def loads(data: bytes | str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse ``data`` (UTF-8 bytes or str) strictly; see the module table for what is refused.

    ``max_depth``: most nested objects/arrays allowed (the endpoint's shape needs no more).
    Returns plain dicts, lists, strings, ints, floats, bools and None.
    Raises :class:`ProtocolError` with code ``json_malformed``, ``json_too_deep``,
    ``json_duplicate_key``, ``json_number_out_of_range`` or ``json_invalid_string`` and the
    JSON path of the offending value as ``field`` (``None`` when the body as a whole is bad).
    ADR-0012 §1, §4.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            valid = data[: exc.start].decode("utf-8")
            field = _scan(valid, max_depth=max_depth, stop=len(valid))
            raise ProtocolError("json_malformed", f"body is not UTF-8 (byte {exc.start})", field) from None
    else:
        text = data
    check_depth(text, max_depth)
    try:
        tree = json.loads(
            text, object_pairs_hook=_object, parse_float=_float, parse_int=_int, parse_constant=_constant
        )
    except json.JSONDecodeError as exc:
        field = _scan(text, max_depth=max_depth, stop=exc.pos)
        if exc.msg.startswith("Invalid control character"):
            raise ProtocolError(
                "json_invalid_string", "a string holds a raw control character", field
            ) from None
        raise ProtocolError(
            "json_malformed", f"{exc.msg} at line {exc.lineno} column {exc.colno}", field
        ) from None
    except (ValueError, RecursionError) as exc:  # pragma: no cover - the pre-scan bounds both
        raise ProtocolError("json_malformed", str(exc)[:200]) from None
    _walk(tree, None)
    return tree


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON for bodies (ADR-0012 §1); not canonical (see ``protocol.capabilities``)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
