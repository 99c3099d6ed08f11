"""The only request parser: strict JSON (``protocol.strictjson``) with a per-view nesting limit."""

from __future__ import annotations

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
        data = stream.read() if stream is not None else b""
        if not data:
            return {}
        return strictjson.loads(data, max_depth=depth)
