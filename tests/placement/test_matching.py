"""Matching a snapshot against a placement: pure, deterministic, required before preferred."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement import spec
from placement.matching import CATEGORIES, first_mismatch, match
from protocol import capabilities as caps
from tests.protocol.strategies import (
    LABEL_KEYS,
    LABEL_VALUES,
    placement_docs,
    reordered,
    snapshot_docs,
)

WORKER = {
    "arch": "x86_64",
    "os": "linux",
    "executors": ["shell", "python"],
    "runtimes": [{"name": "python", "version": "3.11.7"}, {"name": "node", "version": "20.1.0"}],
    "labels": {"zone": "eu-1", "disk": "ssd"},
    "memoryMiB": 4096,
    "diskMiB": 20480,
    "cpuCount": 4,
    "gpus": [
        {"vendor": "nvidia", "model": "A100", "memoryMiB": 40960, "features": ["cuda12"], "count": 2},
        {"vendor": "nvidia", "model": "T4", "memoryMiB": 16384, "features": ["cuda11"]},
    ],
    "features": [],
}


def snap(**changes) -> dict:
    return caps.snapshot({**copy.deepcopy(WORKER), **changes}).document


def place(required=None, preferred=None, executor="shell") -> dict:
    return spec.normalise(
        {"required": required or {}, "preferred": preferred or {}}, executor=executor
    ).document


@pytest.mark.parametrize(
    ("required", "executor", "category"),
    [
        ({}, "node", "executor"),
        ({"arch": ["aarch64"]}, "shell", "arch"),
        ({"os": ["darwin", "windows"]}, "shell", "os"),
        ({"runtimes": {"python": ">=3.12"}}, "shell", "runtime"),
        ({"runtimes": {"go": "*"}}, "shell", "runtime"),
        ({"labels": {"zone": "eu-2"}}, "shell", "labels"),
        ({"labels": {"rack": "r1"}}, "shell", "labels"),
        ({"minMemoryMiB": 4097}, "shell", "memory"),
        ({"minDiskMiB": 20481}, "shell", "disk"),
        ({"gpu": {"vendor": "amd"}}, "shell", "gpu"),
        ({"gpu": {"count": 4}}, "shell", "gpu"),
        ({"gpu": {"features": ["cuda12"], "count": 3}}, "shell", "gpu"),
        ({"gpu": {"minMemoryMiB": 40961}}, "shell", "gpu"),
    ],
)
def test_each_category(required, executor, category):
    assert match(snap(), place(required, executor=executor)).category == category


@pytest.mark.parametrize(
    "required",
    [
        {},
        {"arch": ["amd64", "arm64"]},
        {"os": ["linux"]},
        {"runtimes": {"python": "^3.11", "node": ">=18"}},
        {"labels": {"zone": "eu-1", "disk": "ssd"}},
        {"minMemoryMiB": 4096, "minDiskMiB": 20480},
        {"gpu": {"vendor": "nvidia", "count": 3}},
        {"gpu": {"features": ["cuda12"], "count": 2, "minMemoryMiB": 40960}},
    ],
)
def test_fitting_workers_are_eligible(required):
    assert match(snap(), place(required)).eligible


def test_the_first_failing_category_in_the_fixed_order_is_reported():
    everything_wrong = place(
        {
            "arch": ["aarch64"],
            "os": ["darwin"],
            "runtimes": {"go": "*"},
            "labels": {"zone": "x"},
            "minMemoryMiB": 1 << 20,
            "minDiskMiB": 1 << 30,
            "gpu": {"vendor": "amd"},
        },
        executor="node",
    )
    assert CATEGORIES == ("executor", "arch", "os", "runtime", "labels", "memory", "disk", "gpu")
    assert match(snap(), everything_wrong).category == "executor"
    assert match(snap(executors=["shell", "node"]), everything_wrong).category == "arch"


def test_score_is_the_sum_of_matching_preferred_weights():
    placement = place(
        preferred={
            "labels": [
                {"key": "zone", "value": "eu-1", "weight": 40},
                {"key": "disk", "value": "ssd", "weight": 7},
                {"key": "zone", "value": "eu-2", "weight": 100},
            ]
        }
    )
    assert match(snap(), placement).score == 47
    assert match(snap(labels={}), placement).score == 0


def test_identical_gpus_count_through_their_count():
    placement = place({"gpu": {"features": ["cuda12"], "count": 2}})
    assert match(snap(), placement).eligible
    one = [{"vendor": "nvidia", "model": "A100", "memoryMiB": 40960, "features": ["cuda12"]}]
    assert match(snap(gpus=one), placement).category == "gpu"


SNAPSHOTS = snapshot_docs().map(lambda doc: caps.snapshot(doc).document)
PLACEMENTS = placement_docs().map(lambda doc: spec.normalise(doc, executor="shell").document)


@settings(max_examples=200, deadline=None)
@given(snapshot_docs(), placement_docs(), st.data())
def test_matching_is_deterministic_and_blind_to_wire_order(snapshot_doc, placement_doc, data):
    snapshot = caps.snapshot(snapshot_doc).document
    placement = spec.normalise(placement_doc, executor="shell").document
    first = match(snapshot, placement)
    assert match(copy.deepcopy(snapshot), copy.deepcopy(placement)) == first
    permuted_snapshot = caps.snapshot(reordered(data.draw, snapshot_doc)).document
    permuted_placement = spec.normalise(reordered(data.draw, placement_doc), executor="shell").document
    assert match(permuted_snapshot, permuted_placement) == first


@settings(max_examples=200, deadline=None)
@given(SNAPSHOTS, PLACEMENTS)
def test_preferred_never_admits_a_worker_required_rejects(snapshot, placement):
    result = match(snapshot, placement)
    required_verdict = first_mismatch(snapshot, placement["required"])
    assert result.eligible == (required_verdict is None)
    assert result.category == required_verdict
    # Any preferred block at all — even one naming exactly this worker's labels — changes nothing.
    flattering = {
        **placement,
        "preferred": {
            "labels": [
                {"key": key, "value": value, "weight": 100}
                for key, value in list(snapshot["labels"].items())[:16]
            ]
        },
    }
    assert match(snapshot, flattering).eligible == result.eligible
    assert match(snapshot, flattering).category == result.category


@settings(max_examples=200, deadline=None)
@given(SNAPSHOTS, placement_docs(), LABEL_KEYS, LABEL_VALUES, st.integers(1, 100), st.booleans())
def test_adding_a_preferred_label_never_changes_eligibility(snapshot, placement_doc, key, value, weight, own):
    if own and snapshot["labels"]:
        key, value = next(iter(snapshot["labels"].items()))  # often a label the worker carries
    entries = placement_doc.get("preferred", {}).get("labels", [])
    if len(entries) >= spec.MAX_PREFERRED_LABELS or any(
        (e["key"], e["value"]) == (key, value) for e in entries
    ):
        entries = entries[:-1] if entries else entries
        if any((e["key"], e["value"]) == (key, value) for e in entries):
            return  # the label is already preferred; nothing to add
    before = match(snapshot, spec.normalise(placement_doc, executor="shell").document)
    extended = {
        **placement_doc,
        "preferred": {"labels": [*entries, {"key": key, "value": value, "weight": weight}]},
    }
    trimmed = {**placement_doc, "preferred": {"labels": entries}}
    base = match(snapshot, spec.normalise(trimmed, executor="shell").document)
    after = match(snapshot, spec.normalise(extended, executor="shell").document)
    assert (
        (after.eligible, after.category)
        == (before.eligible, before.category)
        == (base.eligible, base.category)
    )
    if after.eligible:
        carries = snapshot["labels"].get(key) == value
        assert after.score == base.score + (weight if carries else 0)
