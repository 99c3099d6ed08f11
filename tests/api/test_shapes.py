"""``api.shapes``: a worker body's compiled check vouches only for what the serializer accepts,
with the same validated data, and vouches for every valid body of the hot endpoints.

Bodies are generated from each serializer's own fields: every key present, absent, valid or
odd (wrong types, bounds ±1, NUL, lone surrogates, other UUID spellings, blank, nested
shapes), plus unknown keys. DRF (a fresh serializer and ``is_valid``) is the reference.
"""

from __future__ import annotations

import base64
import inspect
import string
import uuid
from types import SimpleNamespace

import pytest
from django.core.validators import (
    MaxLengthValidator,
    MaxValueValidator,
    MinLengthValidator,
    MinValueValidator,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from api import shapes
from api.base import StrictSerializer, validated
from api.leases import serializers as lease_s
from api.logs import serializers as log_s
from api.workers import serializers as worker_s
from protocol.wire import OUTPUT_TAIL_BYTES

#: The request bodies of the calls every attempt and session makes: these must compile.
HOT = [
    lease_s.ClaimSerializer,
    lease_s.AckSerializer,
    lease_s.RunningAckSerializer,
    lease_s.StartFailedSerializer,
    lease_s.VersionedLeaseSerializer,
    lease_s.CompleteSerializer,
    worker_s.HeartbeatSerializer,
    worker_s.TransitionSerializer,
    log_s.LogChunkSerializer,
]
WORKER_BODIES = sorted(
    {
        klass
        for module in (lease_s, log_s, worker_s)
        for _, klass in inspect.getmembers(module, inspect.isclass)
        if issubclass(klass, StrictSerializer) and klass.__module__ == module.__name__
    },
    key=lambda klass: klass.__name__,
)
COMPILED = [klass for klass in WORKER_BODIES if shapes.compiled(klass) is not None]

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["", " ", "a\x00b", "\ud800", "é", "1", "true", "succeeded", "stdout", "A" * 129]),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: f"urn:uuid:{u}"),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_TOKEN_ALPHABET = string.ascii_letters + string.digits + "-_"


def _limits(field, low_type, high_type):
    by_type = {type(v): getattr(v, "limit_value", None) for v in field.validators}
    return by_type.get(low_type), by_type.get(high_type)


def valid(field) -> st.SearchStrategy:
    """Values the field accepts (for the completeness check), built from its own bounds."""
    if isinstance(field, serializers.ListSerializer):
        low = max(field.min_length or 0, 0 if field.allow_empty else 1)
        return st.lists(valid(field.child), min_size=low, max_size=field.max_length or low + 3)
    if isinstance(field, serializers.Serializer):
        return body(field, odd=False)
    if isinstance(field, serializers.ChoiceField):
        return st.sampled_from(sorted(field.choice_strings_to_values))
    if isinstance(field, serializers.UUIDField):
        return st.uuids().map(str)
    if isinstance(field, serializers.IntegerField):
        low, high = _limits(field, MinValueValidator, MaxValueValidator)
        return st.integers(
            min_value=-(2**63) if low is None else low, max_value=2**63 if high is None else high
        )
    if isinstance(field, log_s.Base64Field):
        return st.binary(max_size=min(field.max_bytes, 64)).map(lambda b: base64.b64encode(b).decode())
    if isinstance(field, lease_s.LeaseTokenField):
        return st.text(_TOKEN_ALPHABET, min_size=22, max_size=128)
    if isinstance(field, serializers.CharField):
        low, high = _limits(field, MinLengthValidator, MaxLengthValidator)
        low = max(low or 0, 0 if field.allow_blank else 1)
        return st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            min_size=low,
            max_size=min(high or 40, 40),
        )
    raise AssertionError(f"no strategy for {field!r}")


def near(field) -> st.SearchStrategy:
    """Values at the edge of what the field accepts: bounds ±1, a valid text with one NUL, lone
    surrogate, space or character too many, a valid list one entry too long or short."""
    if isinstance(field, serializers.ListSerializer):
        return st.lists(valid(field.child), max_size=(field.max_length or 3) + 1) | st.lists(
            near(field.child), min_size=1, max_size=2
        )
    if isinstance(field, serializers.Serializer):
        return body(field, odd=True)
    if isinstance(field, serializers.IntegerField):
        low, high = _limits(field, MinValueValidator, MaxValueValidator)
        edges = [edge + step for edge in (low, high) if edge is not None for step in (-1, 0, 1)]
        return st.sampled_from(edges or [0]) | st.sampled_from([True, 1.0, "1"])
    if isinstance(field, serializers.CharField | serializers.ChoiceField | serializers.UUIDField):
        return st.tuples(
            valid(field), st.sampled_from(["\x00", "\ud800", " ", "a", "é", ""]), st.integers(0, 200)
        ).map(lambda drawn: drawn[0][: drawn[2]] + drawn[1] + drawn[0][drawn[2] :]) | valid(field).map(
            lambda text: text[:-1]
        )
    return ODD


def body(serializer, *, odd: bool) -> st.SearchStrategy:
    """A body for ``serializer``. Without ``odd``: required keys hold valid values, optional ones
    may be absent. With ``odd``: such a body with one to three keys made absent, odd
    (:data:`ODD`) or edgy (:func:`near`), sometimes an unknown key, or no object at all."""
    fields = serializer.fields
    keys = {
        name: valid(field) if field.required else st.one_of(valid(field), st.just(shapes.Defer))
        for name, field in fields.items()
    }

    def without_absent(drawn: dict) -> dict:
        return {key: value for key, value in drawn.items() if value is not shapes.Defer}

    plain = st.fixed_dictionaries(keys).map(without_absent)
    if not odd:
        return plain

    @st.composite
    def spoilt(draw) -> object:
        sent = draw(plain)
        for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True)):
            value = draw(st.one_of(st.just(shapes.Defer), ODD, near(fields[name])))
            if value is shapes.Defer:
                sent.pop(name, None)
            else:
                sent[name] = value
        sent.update(
            draw(st.dictionaries(st.sampled_from(["x", "workerid", "lease_token", ""]), ODD, max_size=1))
        )
        return sent

    return spoilt() | ODD


def example(field):
    """One value the field accepts (the base of the edge cases)."""
    if isinstance(field, serializers.ListSerializer):
        return [example(field.child)] * max(1, field.min_length or 0)
    if isinstance(field, serializers.Serializer):
        return {name: example(child) for name, child in field.fields.items()}
    if isinstance(field, serializers.ChoiceField):
        return sorted(field.choice_strings_to_values)[0]
    if isinstance(field, serializers.UUIDField):
        return "0190f3a4-5b6c-7d8e-9f01-23456789abcd"
    if isinstance(field, serializers.IntegerField):
        low, _ = _limits(field, MinValueValidator, MaxValueValidator)
        return 1 if low is None else max(low, 1)
    if isinstance(field, log_s.Base64Field):
        return "aGk="
    if isinstance(field, serializers.CharField):
        low, _ = _limits(field, MinLengthValidator, MaxLengthValidator)
        return "A" * max(low or 0, 22 if isinstance(field, lease_s.LeaseTokenField) else 1)
    raise AssertionError(f"no example for {field!r}")


def edges(field) -> list:
    """The values around the field's every rule, each inside a valid enclosing value (for a
    nested body or a list, one entry or key at a time)."""
    common = [None, True, 1.5, [], {}, "", " "]
    if isinstance(field, serializers.ListSerializer):
        one = example(field.child)
        high = field.max_length or 3
        return [*common, "x", [one] * high, [one] * (high + 1), *([entry] for entry in edges(field.child))]
    if isinstance(field, serializers.Serializer):
        base = example(field)
        spoilt = [{**base, name: edge} for name, child in field.fields.items() for edge in edges(child)]
        dropped = [{key: value for key, value in base.items() if key != name} for name in base]
        return [*common, base, {**base, "x": 1}, *spoilt, *dropped]
    if isinstance(field, serializers.IntegerField):
        low, high = _limits(field, MinValueValidator, MaxValueValidator)
        bounds = [bound + step for bound in (low, high) if bound is not None for step in (-1, 0, 1)]
        return [*common, *bounds, 0, 2**63, 2**64 + 1, -(2**64) - 1, "1", 1.0, False]
    base = example(field)
    texts = [
        base + "\x00",
        "\x00" + base,
        base + "\ud800",
        base + "é",
        "é" * len(base),
        base + " ",
        base.upper(),
        base[:-1],
        base * 2,
    ]
    if isinstance(field, serializers.CharField):
        low, high = _limits(field, MinLengthValidator, MaxLengthValidator)
        texts += [
            "A" * size for size in (low, high) if size is not None for size in (size - 1, size, size + 1)
        ]
    if isinstance(field, serializers.ChoiceField):
        texts += sorted(field.choice_strings_to_values)
    if isinstance(field, serializers.UUIDField):
        texts += ["{" + base + "}", base.replace("-", ""), f"urn:uuid:{base}", base.upper(), 7]
    if isinstance(field, lease_s.TailField):
        limit = OUTPUT_TAIL_BYTES
        texts += ["é" * (limit // 2), "é" * (limit // 2 + 1), "😀" * (limit // 4 + 1), "A" * (limit + 1)]
    if isinstance(field, log_s.Base64Field):
        texts += ["aGk", "aGk=\n", "a-k=", base64.b64encode(b"x" * (field.max_bytes + 1)).decode()]
    return [*common, *texts, 1, 0]


def edge_bodies(serializer_class) -> list:
    serializer = serializer_class()
    base = example(serializer)
    bodies = [base, {**base, "x": 1}, [base], None]
    for name, field in serializer.fields.items():
        bodies.append({key: value for key, value in base.items() if key != name})
        bodies += [{**base, name: edge} for edge in edges(field)]
    return bodies


def drf(serializer_class, data):
    serializer = serializer_class(data=data)
    if serializer.is_valid():
        return "valid", serializer.validated_data
    return "refused", serializer.errors


def _wide(value) -> bool:
    """Holds an integer wider than the check vouches for where a field sets no bound."""
    if isinstance(value, dict):
        return any(_wide(entry) for entry in value.values())
    if isinstance(value, list):
        return any(_wide(entry) for entry in value)
    return type(value) is int and abs(value) > 2**64


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (``uuid.UUID`` is not its text)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("serializer_class", HOT, ids=lambda klass: klass.__name__)
def test_the_hot_bodies_compile(serializer_class):
    assert shapes.compiled(serializer_class) is not None


@pytest.mark.parametrize("serializer_class", COMPILED, ids=lambda klass: klass.__name__)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_what_the_check_vouches_for_drf_accepts_with_the_same_data(serializer_class, data):
    check = shapes.compiled(serializer_class)
    sent = data.draw(body(serializer_class(), odd=True))
    reference = drf(serializer_class, sent)
    try:
        got = check(sent)
    except shapes.Defer:
        return
    assert reference[0] == "valid", (sent, reference)
    assert same(got, reference[1]), (got, reference[1])


@pytest.mark.parametrize("serializer_class", COMPILED, ids=lambda klass: klass.__name__)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_check_vouches_for_every_valid_body(serializer_class, data):
    sent = data.draw(body(serializer_class(), odd=False))
    reference = drf(serializer_class, sent)
    if reference[0] != "valid":  # a cross-field rule (validate_<field>) may still refuse it
        with pytest.raises(shapes.Defer):
            shapes.compiled(serializer_class)(sent)
        return
    got = shapes.compiled(serializer_class)(sent)
    assert same(got, reference[1])


@pytest.mark.parametrize("serializer_class", COMPILED, ids=lambda klass: klass.__name__)
def test_the_check_and_drf_agree_at_every_edge(serializer_class):
    """Every rule's edge, one at a time, deterministically: the check vouches only for what DRF
    accepts, with the same data, and for every edge DRF accepts."""
    check = shapes.compiled(serializer_class)
    for sent in edge_bodies(serializer_class):
        reference = drf(serializer_class, sent)
        try:
            got = check(sent)
        except shapes.Defer:
            assert reference[0] == "refused" or _wide(sent), (sent, reference)
            continue
        assert reference[0] == "valid", (sent, reference)
        assert same(got, reference[1]), (sent, got, reference[1])


def test_validated_answers_a_deferred_body_with_drfs_refusal():
    sent = {"sessionId": str(uuid.uuid4()), "generation": 0, "expectedVersion": 1, "availableSlots": 1}
    with pytest.raises(serializers.ValidationError) as refused:
        validated(worker_s.HeartbeatSerializer, SimpleNamespace(data=sent))
    assert refused.value.detail == drf(worker_s.HeartbeatSerializer, sent)[1]


class _Checked(StrictSerializer):
    name = serializers.CharField()  # DRF's own CharField trims whitespace: no rule for it


class _Validating(StrictSerializer):
    count = serializers.IntegerField()

    def validate(self, attrs):
        return attrs


class _Subclassed(lease_s.LeaseTokenField):
    def to_internal_value(self, data):
        raise serializers.ValidationError("never")


class _WithSubclass(StrictSerializer):
    token = _Subclassed()


class _Loose(serializers.Serializer):
    count = serializers.IntegerField()


@pytest.mark.parametrize("serializer_class", [_Checked, _Validating, _WithSubclass, _Loose])
def test_a_serializer_beyond_the_rules_is_left_to_drf(serializer_class):
    """A field without a rule of its own class, a serializer-wide ``validate``, a subclass that
    checks more, a serializer that ignores unknown keys: nothing is compiled."""
    assert shapes.compiled(serializer_class) is None
