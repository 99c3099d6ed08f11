"""The only request parser: strict JSON (``protocol.strictjson``) with a per-view nesting limit."""

from __future__ import annotations

from typing import Any

from rest_framework.parsers import BaseParser

from protocol import strictjson


class StrictJSONParser(BaseParser):
    """Parses ``application/json`` refusing duplicate keys, NaN/Infinity, out-of-range numbers,
    lone surrogates and nesting beyond the view's ``max_json_depth`` (default 8).

    The body's size was already bounded by ``BodyLimitMiddleware`` before anything read it.
    Raises ``protocol.errors.ProtocolError`` (400 with the offending field's path).
    """

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        view = (parser_context or {}).get("view")
        depth = getattr(view, "max_json_depth", strictjson.DEFAULT_MAX_DEPTH)
        return parse_body(stream.read() if stream is not None else b"", max_depth=depth)


def parse_body(body: bytes, *, max_depth: int) -> Any:
    """A request body as the worker API reads it: ``{}`` when empty, else strict JSON nested at
    most ``max_depth`` deep. Raises ``protocol.errors.ProtocolError`` (400, naming the field)."""
    if not body:
        return {}
    return strictjson.loads(body, max_depth=max_depth)
