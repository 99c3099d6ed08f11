"""Worker bodies checked without DRF's field machinery, for the bodies DRF would accept.

A strict serializer (``api.base.StrictSerializer``) is the one definition of a request body: its
fields, bounds and messages, the OpenAPI schema, every 400 and the field it names. Running it is
the largest piece of Python left in a worker call that is not the write path itself: 80–150 µs a
body (a completion with its next claim: about 150 µs, a heartbeat 36 µs), most of it DRF's
generic steps per field (``validate_empty_values``, ``run_validators``, ``get_value``,
``set_value``, lazy messages) rather than the checks. :func:`compiled` reads a serializer's fields
once and builds a plain function that runs only the checks, in the same order, and returns the
same validated data (the same keys, values and types).

The function vouches only for bodies it can prove valid. Anything else — a missing required key,
a wrong type, a bound crossed, an unknown key, a value it has no rule for — raises :class:`Defer`,
and the caller (``api.base.validated``) runs the serializer itself, which answers exactly the 400
it always answered. So the error contract cannot drift: only DRF ever writes an error.

Only what is known is compiled: a field is compiled by the rule registered for its exact class
(:func:`rule`), and a rule refuses (returns ``None``) a field configured beyond what it reads (a
validator it does not know, a default that needs context). A serializer with any field without a
rule, a ``validate()`` of its own, ``Meta.validators``, a read-only field or a ``source`` is not
compiled: :func:`compiled` returns ``None`` and DRF validates every body. ``tests/api/test_shapes.py``
checks, for every serializer of the worker API, that the function and DRF agree on generated
bodies: whatever the function accepts, DRF accepts with the same data.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import (
    MaxLengthValidator,
    MaxValueValidator,
    MinLengthValidator,
    MinValueValidator,
    ProhibitNullCharactersValidator,
)
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.validators import ProhibitSurrogateCharactersValidator

#: A compiled check of one value: the validated value, or :class:`Defer`.
Check = Callable[[Any], Any]
#: A rule: the check of one field instance, or ``None`` when the field is beyond the rule.
Rule = Callable[[Any], Check | None]

_RULES: dict[type, Rule] = {}
#: The widest integer a side without a bound vouches for (wider ones go to DRF).
_WIDEST = 2**64


class Defer(Exception):
    """The compiled check cannot vouch for this value: let the serializer decide."""


def rule(field_class: type) -> Callable[[Rule], Rule]:
    """Register the rule compiling fields of exactly ``field_class`` (not its subclasses: a
    subclass may check more, so it needs a rule of its own). Used as a decorator."""

    def register(compile_field: Rule) -> Rule:
        _RULES[field_class] = compile_field
        return compile_field

    return register


def validators_of(field: Any, known: tuple[type, ...]) -> dict[type, Any] | None:
    """``field``'s validators by type, or ``None`` when one is not of a ``known`` type (or two
    are of the same type): a rule then cannot say what the field checks."""
    found: dict[type, Any] = {}
    for validator in field.validators:
        kind = type(validator)
        if kind not in known or kind in found or callable(getattr(validator, "limit_value", None)):
            return None
        found[kind] = validator
    return found


@functools.cache
def compiled(serializer_class: type[serializers.Serializer]) -> Check | None:
    """The compiled check of a strict serializer's bodies (module docstring), built once per
    class and process, or ``None`` when the serializer is beyond the rules.

    The check takes the parsed body and returns what ``serializer_class(data=body)`` would have
    as ``validated_data`` when it is valid; it raises :class:`Defer` for anything else.
    """
    return _serializer_check(serializer_class())


def _serializer_check(serializer: serializers.Serializer) -> Check | None:
    """A (possibly nested) serializer's ``to_internal_value`` and ``validate`` as one check."""
    kind = type(serializer)
    parser = next(klass for klass in kind.__mro__ if "to_internal_value" in vars(klass))
    if (
        not vars(parser).get("refuses_unknown_fields", False)  # unknown keys refused by name
        or not getattr(kind, "refuses_unknown_fields", False)
        or kind.validate is not serializers.Serializer.validate
        or kind.run_validation is not serializers.Serializer.run_validation
        or kind.run_validators is not serializers.Serializer.run_validators
        or serializer.validators
    ):
        return None
    steps = []
    for name, field in serializer.fields.items():
        if field.read_only or field.source_attrs != [name]:
            return None
        check = field_check(field)
        if check is None:
            return None
        default = field.default
        if default is not empty and callable(default) and getattr(default, "requires_context", False):
            return None
        method = getattr(serializer, f"validate_{name}", None)
        steps.append((name, check, field.required, default, field.allow_null, method))
    names = frozenset(serializer.fields)

    def check_body(data: Any) -> dict:
        if type(data) is not dict or not names.issuperset(data):
            raise Defer  # not an object, or an unknown key: the serializer names it
        out = {}
        for name, check, required, default, allow_null, method in steps:
            value = data.get(name, empty)
            if value is empty:
                if required:
                    raise Defer
                if default is empty:
                    continue  # DRF's SkipField: the key stays absent
                value = default() if callable(default) else default
            elif value is None:
                if not allow_null:
                    raise Defer
            else:
                value = check(value)
            if method is not None:
                try:
                    value = method(value)
                except (serializers.ValidationError, DjangoValidationError):
                    raise Defer from None
            out[name] = value
        return out

    return check_body


def field_check(field: Any) -> Check | None:
    """The check of one field: a nested serializer, a list of them, or a field with a rule."""
    if isinstance(field, serializers.ListSerializer):
        return _list_check(field)
    if isinstance(field, serializers.Serializer):
        return _serializer_check(field)
    compile_field = _RULES.get(type(field))
    return None if compile_field is None else compile_field(field)


def _list_check(field: serializers.ListSerializer) -> Check | None:
    kind = type(field)
    if (
        kind.validate is not serializers.ListSerializer.validate
        or kind.run_validation is not serializers.ListSerializer.run_validation
        or kind.to_internal_value is not serializers.ListSerializer.to_internal_value
        or kind.run_child_validation is not serializers.ListSerializer.run_child_validation
        or field.validators
    ):
        return None
    item = field_check(field.child)
    if item is None:
        return None
    # The stubs do not list the bounds DRF keeps on a ListSerializer (min_length, max_length).
    shortest: int | None = getattr(field, "min_length", None)
    high: int | None = getattr(field, "max_length", None)
    low = max(0 if field.allow_empty else 1, shortest or 0)

    def check_list(value: Any) -> list:
        if type(value) is not list or len(value) < low or (high is not None and len(value) > high):
            raise Defer
        return [item(entry) for entry in value]

    return check_list


# --- the rules of DRF's own fields; api.base and the serializers register their fields' --------


def text_check(field: Any) -> Check | None:
    """A ``CharField``'s checks as ``api.base.StrictCharField`` runs them (strings only, taken as
    sent): blank, length, NUL and lone surrogates. For rules of ``StrictCharField`` subclasses."""
    if field.trim_whitespace:
        return None
    found = validators_of(
        field,
        (
            MaxLengthValidator,
            MinLengthValidator,
            ProhibitNullCharactersValidator,
            ProhibitSurrogateCharactersValidator,
        ),
    )
    if (
        found is None
        or not {ProhibitNullCharactersValidator, ProhibitSurrogateCharactersValidator} <= found.keys()
    ):
        return None
    allow_blank = field.allow_blank
    high = found[MaxLengthValidator].limit_value if MaxLengthValidator in found else None
    low = found[MinLengthValidator].limit_value if MinLengthValidator in found else 0

    def check_text(value: Any) -> str:
        if type(value) is not str:
            raise Defer
        if value == "":
            if allow_blank:
                return ""
            raise Defer
        size = len(value)
        if size < low or (high is not None and size > high) or "\x00" in value:
            raise Defer
        if not value.isascii():
            try:
                value.encode("utf-8")  # fails on a lone surrogate
            except UnicodeEncodeError:
                raise Defer from None
        return value

    return check_text


def refined_text_check(field: Any, accepts: Callable[[str], object]) -> Check | None:
    """:func:`text_check`, then ``accepts(value)`` must be true: for a ``StrictCharField``
    subclass whose ``to_internal_value`` refuses more text (a pattern, a size in bytes)."""
    text = text_check(field)
    if text is None:
        return None

    def check_refined(value: Any) -> str:
        value = text(value)
        if not accepts(value):
            raise Defer
        return value

    return check_refined


@rule(serializers.ChoiceField)
def _choice(field: serializers.ChoiceField) -> Check | None:
    if field.validators:
        return None
    choices: Mapping[str, Any] = field.choice_strings_to_values
    allow_blank = field.allow_blank

    def check_choice(value: Any) -> Any:
        if type(value) is not str:
            raise Defer
        if value == "" and allow_blank:
            return ""
        try:
            return choices[value]
        except KeyError:
            raise Defer from None

    return check_choice


def integer_check(field: Any) -> Check | None:
    """An ``IntegerField`` that takes JSON integers only (``api.base.StrictIntegerField``), with
    its bounds."""
    found = validators_of(field, (MinValueValidator, MaxValueValidator))
    if found is None:
        return None
    # An unbounded side is bounded here all the same: DRF turns the integer into text and back,
    # which fails past 4,300 digits; such a number is left to it.
    low = found[MinValueValidator].limit_value if MinValueValidator in found else -_WIDEST
    high = found[MaxValueValidator].limit_value if MaxValueValidator in found else _WIDEST

    def check_integer(value: Any) -> int:
        if type(value) is not int or value < low or value > high:
            raise Defer
        return value

    return check_integer


def uuid_check(pattern: Any) -> Check:
    """A UUID sent as text matching ``pattern`` (a compiled regular expression), as
    ``uuid.UUID``."""

    def check_uuid(value: Any) -> uuid.UUID:
        if type(value) is not str or pattern.fullmatch(value) is None:
            raise Defer
        return uuid.UUID(value)

    return check_uuid
