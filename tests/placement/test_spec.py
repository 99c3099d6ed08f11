"""PlacementSpec validation and normalisation (ADR-0012 §4), pure: no database."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement import spec
from placement.matching import satisfies
from protocol import strictjson
from protocol.errors import ProtocolError
from tests.protocol.strategies import JSON, invalid_placements, placement_docs, reordered, rewhitespaced


def refused(document, executor: str = "shell") -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        spec.normalise(document, executor=executor)
    assert caught.value.code == "placement_invalid"
    return caught.value


def test_empty_placement_normalises_to_every_key_with_the_revision_executor():
    result = spec.normalise({}, executor="python")
    assert result.document == {
        "required": {
            "executor": "python",
            "arch": [],
            "os": [],
            "runtimes": {},
            "labels": {},
            "minMemoryMiB": 0,
            "minDiskMiB": 0,
            "gpu": None,
        },
        "preferred": {"labels": []},
    }
    assert result.sha256 == hashlib.sha256(result.canonical).hexdigest()
    assert result.canonical_text == (
        '{"preferred":{"labels":[]},"required":{"arch":[],"executor":"python","gpu":null,"labels":{},'
        '"minDiskMiB":0,"minMemoryMiB":0,"os":[],"runtimes":{}}}'
    )


def test_aliases_sets_and_range_spacing_are_normalised():
    result = spec.normalise(
        {
            "required": {
                "arch": ["arm64", "AMD64"],
                "os": ["macOS"],
                "runtimes": {"python": "  >=3.9    <4 "},
                "gpu": {"features": ["fp16", "cuda12"]},
            },
            "preferred": {
                "labels": [
                    {"key": "zone", "value": "b", "weight": 2},
                    {"key": "disk", "value": "ssd", "weight": 100},
                ]
            },
        },
        executor="shell",
    )
    required = result.document["required"]
    assert required["arch"] == ["aarch64", "x86_64"] and required["os"] == ["darwin"]
    assert required["runtimes"] == {"python": ">=3.9 <4"}
    assert required["gpu"] == {"vendor": None, "count": 1, "minMemoryMiB": 0, "features": ["cuda12", "fp16"]}
    assert [e["key"] for e in result.document["preferred"]["labels"]] == ["disk", "zone"]


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ([], None),
        ({"requird": {}}, "requird"),
        ({"required": {"cpuCount": 1}}, "required.cpuCount"),
        ({"required": {"gpu": {"model": "A100"}}}, "required.gpu.model"),
        ({"preferred": {"weights": []}}, "preferred.weights"),
        (
            {"preferred": {"labels": [{"key": "a", "value": "b", "weight": 1, "x": 1}]}},
            "preferred.labels[0].x",
        ),
    ],
)
def test_unknown_fields_are_refused_at_every_level(document, field):
    assert refused(document).field == field


@pytest.mark.parametrize(
    "text",
    [
        ">=banana",
        "latest",
        "1.2.3.4",
        ">>1",
        "",
        "   ",
        "||",
        "^1 ||",
        "|| ^1",
        ">=1\t",
        "1.x\n",
        ">=01.2.3",
        "≥1.0",
        ">=1.0.0\x00",
        "a" * 129,
        3,
        None,
        ["1"],
        ">=99999999999999999999999",
        "1" * 128,
        "^1.12345678901234567",  # numbers past 16 digits
    ],
)
def test_invalid_semver_ranges_are_refused_naming_the_runtime(text):
    error = refused({"required": {"runtimes": {"python": text}}})
    assert error.field == "required.runtimes.python"


@pytest.mark.parametrize(
    "text",
    [
        ">=3.9",
        "^3.11",
        "~1.2.3",
        "3.x",
        "*",
        "1.2.3 - 2.3.4",
        "^18 || ^20",
        ">=2.2.0-rc.0",
        "=1.2.3",
        "v1.2.3",
        "<2",
        ">=9999999999999999",
    ],
)
def test_valid_semver_ranges_are_accepted(text):
    assert spec.normalise({"required": {"runtimes": {"node": text}}}, executor="shell").document["required"][
        "runtimes"
    ] == {"node": text}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"required": {"arch": ["x86_64"] * 17}}, "required.arch"),
        ({"required": {"os": ["linux"] * 9}}, "required.os"),
        ({"required": {"runtimes": {f"r{i}": "*" for i in range(17)}}}, "required.runtimes"),
        ({"required": {"labels": {f"k{i}": "v" for i in range(33)}}}, "required.labels"),
        ({"required": {"gpu": {"features": [f"f{i}" for i in range(17)]}}}, "required.gpu.features"),
        (
            {"preferred": {"labels": [{"key": f"k{i}", "value": "v", "weight": 1} for i in range(17)]}},
            "preferred.labels",
        ),
    ],
)
def test_oversize_sets_are_refused(document, field):
    assert refused(document).field == field


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"required": {"arch": ["amd64", "x86_64"]}}, "required.arch[1]"),
        ({"required": {"arch": ["sparc"]}}, "required.arch[0]"),
        ({"required": {"os": ["plan9"]}}, "required.os[0]"),
        ({"required": {"executor": "node"}}, "required.executor"),
        ({"required": {"minMemoryMiB": -1}}, "required.minMemoryMiB"),
        ({"required": {"minDiskMiB": True}}, "required.minDiskMiB"),
        ({"required": {"gpu": {"count": 17}}}, "required.gpu.count"),
        ({"required": {"gpu": {"vendor": "NVIDIA"}}}, "required.gpu.vendor"),
        ({"required": {"gpu": {"features": ["a", "a"]}}}, "required.gpu.features[1]"),
        ({"required": {"labels": {"Zone": "x"}}}, "required.labels.Zone"),
        ({"required": {"labels": {"zone": "x y"}}}, "required.labels.zone"),
        ({"required": {"runtimes": {"Py": "*"}}}, "required.runtimes.Py"),
        (
            {"preferred": {"labels": [{"key": "zone", "value": "eu", "weight": 0}]}},
            "preferred.labels[0].weight",
        ),
        (
            {"preferred": {"labels": [{"key": "zone", "value": "eu", "weight": 101}]}},
            "preferred.labels[0].weight",
        ),
        (
            {"preferred": {"labels": [{"key": "zone", "value": "eu", "weight": None}]}},
            "preferred.labels[0].weight",
        ),
        ({"preferred": {"labels": [{"key": "zone", "value": "eu"}]}}, "preferred.labels[0].weight"),
        ({"preferred": {"labels": [None]}}, "preferred.labels[0]"),
        (
            {
                "preferred": {
                    "labels": [
                        {"key": "a", "value": "b", "weight": 1},
                        {"key": "a", "value": "b", "weight": 2},
                    ]
                }
            },
            "preferred.labels[1]",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_field(document, field):
    assert refused(document).field == field


def test_normalised_placement_over_8_kib_is_refused_as_a_whole():
    labels = {f"{'k' * 55}{i:03d}": "v" * 63 for i in range(32)}
    runtimes = {f"r{i:02d}{'x' * 28}": " || ".join(["^1.2.3"] * 13) for i in range(16)}  # 126 characters
    preferred = [{"key": f"{'p' * 60}{i:02d}", "value": "w" * 63, "weight": 100} for i in range(16)]
    error = refused(
        {"required": {"labels": labels, "runtimes": runtimes}, "preferred": {"labels": preferred}}
    )
    assert error.field is None and "8192" in error.message


@pytest.mark.parametrize(
    ("version", "version_range", "expected"),
    [
        ("2.2.0-rc.1", ">=2.0.0", False),  # npm: a prerelease needs a prerelease comparator of the same x.y.z
        ("2.2.0-rc.1", ">=2.2.0-rc.0", True),
        ("2.2.0-rc.1", "^2.2.0-rc.0", True),
        ("2.3.0-rc.1", ">=2.2.0-rc.0", False),  # a prerelease of another x.y.z stays out
        ("2.2.0", ">=2.0.0", True),
        ("2.10.0", ">=2.9", True),  # numeric, not lexical, comparison
        ("2.9.0", ">=2.10", False),
        ("3.11.7", ">=3.9 <4", True),
        ("4.0.0", ">=3.9 <4", False),
        ("20.1.0", "^18 || ^20", True),
        ("19.0.0", "^18 || ^20", False),
        ("1.0.0+build.9", "1.0.0", True),  # build metadata never matters
    ],
)
def test_prerelease_rule_and_numeric_ranges(version, version_range, expected):
    stored = spec.normalise({"required": {"runtimes": {"python": version_range}}}, executor="shell")
    assert satisfies(version, stored.document["required"]["runtimes"]["python"]) is expected


@settings(max_examples=150, deadline=None)
@given(placement_docs(), st.data())
def test_normalisation_is_idempotent_and_order_and_whitespace_free(document, data):
    first = spec.normalise(document, executor="shell")
    assert spec.normalise(first.document, executor="shell").canonical == first.canonical
    text = rewhitespaced(data.draw, reordered(data.draw, document))
    # Reordering a preferred list or a required arch/os list does not change the placement.
    assert spec.normalise(strictjson.loads(text), executor="shell").sha256 == first.sha256


@settings(max_examples=300, deadline=None)
@given(invalid_placements())
def test_every_generated_invalid_placement_is_refused_naming_the_field(case):
    document, field = case
    assert refused(document).field == field


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_arbitrary_json_is_a_placement_or_a_protocol_error_never_another_exception(value):
    try:
        result = spec.normalise(value, executor="shell")
    except ProtocolError as error:
        assert error.code == "placement_invalid"
    else:
        assert spec.normalise(result.document, executor="shell").canonical == result.canonical
