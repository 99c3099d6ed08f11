"""Integer query parameters (and other integer header text): digits bounded in length before
``int()`` so an overlong value is a JSON 400 naming the field, never Python's digit-limit
``ValueError`` (a 500)."""

from __future__ import annotations

from core.errors import DomainError

#: The most digits an integer query parameter may have (2^63 has 19; the API's largest is 2^53).
MAX_QUERY_DIGITS = 20


def digits_value(raw: str) -> int | None:
    """The integer of ``raw`` when it is 1–:data:`MAX_QUERY_DIGITS` ASCII digits, else None."""
    if not 0 < len(raw) <= MAX_QUERY_DIGITS or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def query_int(request, name: str, *, default: int | None, low: int, high: int) -> int | None:
    """The integer query parameter ``name`` of ``request`` (``default`` when absent), from
    ``low`` to ``high`` inclusive. Raises ``validation_failed`` naming ``name``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = digits_value(raw)
    if value is None or not low <= value <= high:
        raise DomainError("validation_failed", f"must be an integer from {low} to {high}", field=name)
    return value
