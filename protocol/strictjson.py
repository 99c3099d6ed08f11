"""Strict JSON parsing for every body the control plane accepts.

``json.loads`` alone accepts duplicate keys (last wins), ``NaN``/``Infinity``, numbers that
overflow to infinity, lone UTF-16 surrogates and recursion deep enough to raise RecursionError.
:func:`loads` refuses all of them with a :class:`~protocol.errors.ProtocolError` whose ``field``
is the JSON path of the offending value, so the API can answer a 400 naming it.

Nesting is checked by a linear pre-scan *before* ``json.loads`` runs, so a 1,000-deep or
1,000,000-deep document costs one pass over its bytes and never recurses.
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

_SURROGATE = re.compile("[\ud800-\udfff]")


class _Bad:
    """Marker left in the parsed tree where a refused literal stood; reported with its path."""

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message


class _Duplicate(dict):
    """An object that repeated a key; the key is reported with the object's path."""

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


def check_depth(text: str, max_depth: int) -> None:
    """Raise ``json_too_deep`` if arrays/objects nest deeper than ``max_depth`` (linear scan)."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                raise ProtocolError("json_too_deep", f"nesting deeper than {max_depth} levels")
        elif char in "]}":
            depth -= 1


def _walk(node: Any, path: str | None) -> None:
    if isinstance(node, _Bad):
        raise ProtocolError(node.code, node.message, path)
    if isinstance(node, dict):
        if isinstance(node, _Duplicate):
            raise ProtocolError(
                "json_duplicate_key", f"key {node.duplicate_key!r} appears more than once", path or None
            )
        for key, value in node.items():
            if _SURROGATE.search(key):
                raise ProtocolError("json_invalid_string", "object key holds a lone surrogate", path)
            _walk(value, join_path(path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _walk(value, join_path(path, index))
    elif isinstance(node, str) and _SURROGATE.search(node):
        raise ProtocolError("json_invalid_string", "string holds a lone UTF-16 surrogate", path)


def loads(data: bytes | str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse ``data`` (UTF-8 bytes or str) strictly.

    Raises :class:`ProtocolError` with code ``json_malformed``, ``json_too_deep``,
    ``json_duplicate_key``, ``json_number_out_of_range`` or ``json_invalid_string``.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("json_malformed", f"body is not UTF-8 (byte {exc.start})") from None
    else:
        text = data
    check_depth(text, max_depth)
    try:
        tree = json.loads(
            text, object_pairs_hook=_object, parse_float=_float, parse_int=_int, parse_constant=_constant
        )
    except json.JSONDecodeError as exc:
        raise ProtocolError("json_malformed", f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # pragma: no cover - the pre-scan bounds both
        raise ProtocolError("json_malformed", str(exc)[:200]) from None
    _walk(tree, None)
    return tree


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON for request/response bodies (not canonical; see protocol.canonical)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
