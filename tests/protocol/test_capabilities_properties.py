"""Property-based acceptance tests of the snapshot schema and canonical form (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import capabilities as caps
from protocol import strictjson
from protocol.errors import ProtocolError
from tests.protocol.strategies import (
    JSON,
    invalid_snapshots,
    reordered,
    respelled_aliases,
    rewhitespaced,
    snapshot_docs,
)


@settings(max_examples=150, deadline=None)
@given(snapshot_docs())
def test_canonicalisation_is_idempotent(document):
    first = caps.snapshot(document)
    again = caps.snapshot(first.document)
    assert again.canonical == first.canonical and again.sha256 == first.sha256
    assert strictjson.loads(first.canonical) == first.document  # the bytes are the document


@settings(max_examples=150, deadline=None)
@given(snapshot_docs(), st.data())
def test_reordered_keys_sets_aliases_and_whitespace_give_the_same_bytes_and_digest(document, data):
    variant = respelled_aliases(data.draw, reordered(data.draw, document))
    text = rewhitespaced(data.draw, variant)
    original, permuted = caps.snapshot(document), caps.snapshot(strictjson.loads(text.encode("utf-8")))
    assert permuted.canonical == original.canonical
    assert permuted.sha256 == original.sha256


@settings(max_examples=300, deadline=None)
@given(invalid_snapshots())
def test_every_generated_invalid_snapshot_is_refused_naming_the_field(case):
    document, field, code = case
    try:
        caps.snapshot(document)
    except ProtocolError as error:
        assert (error.code, error.field) == (code, field), error.message
    else:
        raise AssertionError(f"accepted an invalid snapshot; expected {code} at {field}")


@settings(max_examples=300, deadline=None)
@given(JSON | st.dictionaries(st.sampled_from(sorted(caps._KEYS)), JSON, max_size=10))
def test_arbitrary_json_is_a_snapshot_or_a_protocol_error_never_another_exception(value):
    try:
        result = caps.snapshot(value)
    except ProtocolError as error:
        assert error.code in ("capabilities_invalid", "capabilities_too_large")
        assert error.field
    else:
        assert caps.snapshot(result.document).canonical == result.canonical
