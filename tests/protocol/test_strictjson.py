"""Strict JSON parsing: every refusal is a ProtocolError naming the JSON path (ADR-0012 §4)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import strictjson
from protocol.errors import ProtocolError


def refused(body: bytes | str, *, max_depth: int = strictjson.DEFAULT_MAX_DEPTH) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        strictjson.loads(body, max_depth=max_depth)
    return caught.value


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b'{"memoryMiB": NaN}', "json_number_out_of_range", "memoryMiB"),
        (b'{"a": {"b": [1, Infinity]}}', "json_number_out_of_range", "a.b[1]"),
        (b'{"a": -Infinity}', "json_number_out_of_range", "a"),
        (b'{"capabilities": {"diskMiB": 1e400}}', "json_number_out_of_range", "capabilities.diskMiB"),
        (b'{"n": -1E400}', "json_number_out_of_range", "n"),
        (b'{"n": 12345678901234567890}', "json_number_out_of_range", "n"),
        (b'{"labels": {"zone": "a", "zone": "b"}}', "json_duplicate_key", "labels.zone"),
        (b'{"a": 1, "a": 1}', "json_duplicate_key", "a"),
        (b'{"s": "\\ud800"}', "json_invalid_string", "s"),
        (b'{"s": ["ok", "x\\udfffy"]}', "json_invalid_string", "s[1]"),
        (b'{"k": {"\\udc00": 1}}', "json_invalid_string", "k.\\udc00"),
        (b'{"s": "tab\there"}', "json_invalid_string", "s"),
        (b'{"a": [1, 2, }', "json_malformed", "a[2]"),
        (b'{"a": {"b": tru}}', "json_malformed", "a.b"),
        (b'{"a": "\xff"}', "json_malformed", "a"),
    ],
)
def test_each_refusal_names_the_field(body, code, field):
    error = refused(body)
    assert (error.code, error.field) == (code, field)


def test_nesting_beyond_the_limit_names_the_container_that_crosses_it():
    body = '{"capabilities": {"labels": {"zone": ' + "[" * 1000 + "]" * 1000 + "}}}"
    error = refused(body, max_depth=5)
    assert error.code == "json_too_deep"
    assert error.field == "capabilities.labels.zone[0][0]"


def test_a_million_levels_cost_one_linear_pass_and_no_recursion():
    body = "[" * 1_000_000 + "]" * 1_000_000
    started = time.perf_counter()
    error = refused(body, max_depth=8)
    assert error.code == "json_too_deep" and error.field == "[0]" * 8
    assert time.perf_counter() - started < 2.0


def test_exactly_the_limit_is_accepted():
    assert strictjson.loads('{"a": {"b": [[1]]}}', max_depth=4) == {"a": {"b": [[1]]}}


def test_brackets_and_quotes_inside_strings_do_not_count_as_nesting():
    body = '{"a": "[[[[{{{{\\"]]]]", "b": ["\\\\", "{"]}'
    assert strictjson.loads(body, max_depth=2) == {"a": '[[[[{{{{"]]]]', "b": ["\\", "{"]}


def test_escaped_control_characters_parse_and_are_left_to_the_schema():
    # JSON allows "\n" escapes (a command may hold newlines); field schemas refuse them where needed.
    assert strictjson.loads('{"command": "echo a\\necho b"}') == {"command": "echo a\necho b"}


def test_hostile_keys_are_shown_safely_and_bounded():
    error = refused(b'{"' + b"k" * 500 + b'": [' + b"[" * 20 + b"]" * 20 + b"]}", max_depth=4)
    assert error.field.startswith("k" * 64 + "…") and len(error.field) < 100
    assert strictjson.display_key("a\x00b\ud800") == "a\\u0000b\\ud800"
    assert strictjson.display_key("zone") == "zone"


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**18), 10**18)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(JSON_VALUES)
def test_valid_json_parses_to_what_the_standard_library_reads(value):
    text = json.dumps(value, ensure_ascii=False)
    assert strictjson.loads(text.encode("utf-8"), max_depth=64) == json.loads(text)


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(min_value=1, max_value=6))
def test_the_depth_check_refuses_exactly_the_values_nested_deeper_than_the_limit(value, max_depth):
    """With as few brackets as the limit or fewer, the check skips its scan: it must still agree
    with the value's real depth on both sides of the limit, brackets inside strings included."""
    text = json.dumps(value, ensure_ascii=False)
    if _depth(value) > max_depth:
        with pytest.raises(ProtocolError, match="levels"):
            strictjson.check_depth(text, max_depth)
    else:
        strictjson.check_depth(text, max_depth)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_parsed_or_refused_with_a_protocol_error_never_anything_else(data):
    try:
        strictjson.loads(data)
    except ProtocolError as error:
        assert error.code in {
            "json_malformed",
            "json_too_deep",
            "json_duplicate_key",
            "json_number_out_of_range",
            "json_invalid_string",
        }
        if error.field is not None:
            error.field.encode("utf-8")  # always encodable into the UTF-8 error answer


def test_the_empty_key_is_shown_visibly():
    assert refused(b'{"": 1, "": 2}').field == '""'
    assert strictjson.display_key("") == '""'
