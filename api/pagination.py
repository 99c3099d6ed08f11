"""Cursor pagination for the operator lists (DRF's ``CursorPagination``: an opaque ``cursor``
query parameter, stable under inserts, no page counts, no hard cap on how far one can go)."""

from __future__ import annotations

from base64 import b64decode
from urllib.parse import parse_qs

from django.core.exceptions import FieldDoesNotExist, ValidationError
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response

from api.query import query_int
from core.errors import DomainError

MAX_PAGE = 200


class OperatorCursor(CursorPagination):
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = MAX_PAGE


def paginate(
    request, view, queryset, serializer_class, *, ordering: tuple[str, ...], prepare=None
) -> Response:
    """One page of ``queryset`` in ``ordering`` (the last field unique, e.g. ``("name",)`` or
    ``("-created_at", "-id")``), rendered by ``serializer_class``:
    ``{"next": url|null, "previous": url|null, "results": [...]}``. ``limit`` is 1–200
    (default 50); ``prepare``, if given, is called with the page's rows before rendering.
    Raises ``validation_failed`` naming ``cursor`` or ``limit``."""
    query_int(request, "limit", default=None, low=1, high=MAX_PAGE)
    paginator = OperatorCursor()
    paginator.ordering = ordering
    try:
        _check_position(paginator, request, queryset.model, ordering[0].lstrip("-"))
        page: list | None = paginator.paginate_queryset(queryset, request, view=view)
    except NotFound:
        raise DomainError("validation_failed", "not a cursor this list issued", field="cursor") from None
    if prepare is not None:
        prepare(page)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)


#: What DRF writes into a cursor (``CursorPagination.encode_cursor``): offset, reverse, position.
_CURSOR_KEYS = frozenset({"o", "r", "p"})


def _check_position(paginator: OperatorCursor, request, model, name: str) -> None:
    """Raise ``NotFound`` (as DRF does for a cursor it cannot decode) when the cursor decodes but
    holds anything DRF never writes into one, or its position is no value of the ordering's first
    field (``name`` of ``model``): a cursor is opaque but not signed, and a forged one must be
    refused before it reaches a query — not read as "no position", which is the first page."""
    cursor = paginator.decode_cursor(request)
    if cursor is None:
        return
    encoded = request.query_params[paginator.cursor_query_param]  # decodable: decode_cursor did
    keys = parse_qs(b64decode(encoded.encode("ascii")).decode("ascii"), keep_blank_values=True)
    if not keys.keys() <= _CURSOR_KEYS:
        raise NotFound
    if cursor.position is None:
        return
    if "\x00" in str(cursor.position):
        raise NotFound
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:  # an annotation: nothing to check it against
        return
    try:
        field.to_python(cursor.position)
    except (ValidationError, ValueError, TypeError):
        raise NotFound from None


def page_of(serializer_class) -> type[serializers.Serializer]:
    """The OpenAPI shape of a page of ``serializer_class`` (for ``extend_schema``)."""
    return type(
        f"{serializer_class.__name__.removesuffix('Serializer')}PageSerializer",
        (serializers.Serializer,),
        {
            "next": serializers.URLField(allow_null=True, help_text="the next page, or null"),
            "previous": serializers.URLField(allow_null=True, help_text="the previous page, or null"),
            "results": serializer_class(many=True),
        },
    )


#: Query parameters every paginated list takes.
CURSOR_PARAMETERS = ("cursor", "limit")
