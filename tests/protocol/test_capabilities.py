"""The capability snapshot schema and canonical form (ADR-0012 §4)."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from protocol import capabilities as caps
from protocol import strictjson
from protocol.errors import ProtocolError
from tests.protocol.strategies import snapshot_of_size

BASE = {
    "arch": "x86_64",
    "os": "linux",
    "executors": ["shell"],
    "runtimes": [],
    "labels": {},
    "memoryMiB": 256,
    "diskMiB": 1024,
    "cpuCount": 1,
    "gpus": [],
    "features": [],
}


def doc(**changes):
    return {**copy.deepcopy(BASE), **changes}


def refused(document) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        caps.snapshot(document)
    return caught.value


def test_golden_canonical_bytes_and_digest():
    given = {
        "features": ["zstd", "docker"],
        "gpus": [{"model": "A100", "vendor": "nvidia", "features": ["fp16", "cuda12"], "memoryMiB": 40960}],
        "labels": {"zone": "eu-1", "tier": "Gold"},
        "cpuCount": 8,
        "diskMiB": 20480,
        "memoryMiB": 4096,
        "runtimes": [{"version": "3.11.7", "name": "python"}, {"name": "bash", "version": "5.2.15"}],
        "executors": ["shell", "python"],
        "os": "Linux",
        "arch": "AMD64",
    }
    expected = (
        '{"arch":"x86_64","cpuCount":8,"diskMiB":20480,"executors":["python","shell"],"features":["docker","zstd"],'
        '"gpus":[{"count":1,"features":["cuda12","fp16"],"memoryMiB":40960,"model":"A100","vendor":"nvidia"}],'
        '"labels":{"tier":"Gold","zone":"eu-1"},"memoryMiB":4096,"os":"linux",'
        '"runtimes":[{"name":"bash","version":"5.2.15"},{"name":"python","version":"3.11.7"}]}'
    )
    result = caps.snapshot(given)
    assert result.canonical_text == expected
    assert result.sha256 == hashlib.sha256(expected.encode()).hexdigest()
    assert caps.snapshot(json.loads(expected)).canonical == result.canonical


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("amd64", "x86_64"),
        ("X64", "x86_64"),
        ("arm64", "aarch64"),
        ("armhf", "armv7l"),
        ("i386", "i686"),
        ("loong64", "loongarch64"),
        ("mipsle", "mipsel"),
    ],
)
def test_architecture_aliases_are_normalised(alias, canonical):
    assert caps.snapshot(doc(arch=alias)).document["arch"] == canonical


@pytest.mark.parametrize(
    ("alias", "canonical"), [("macOS", "darwin"), ("osx", "darwin"), ("win32", "windows")]
)
def test_os_aliases_are_normalised(alias, canonical):
    assert caps.snapshot(doc(os=alias)).document["os"] == canonical


@pytest.mark.parametrize(
    ("field", "limit"),
    [
        ("executors", caps.MAX_EXECUTORS),
        ("features", caps.MAX_FEATURES),
    ],
)
def test_name_sets_are_capped_exactly(field, limit):
    names = [f"n{i}" for i in range(limit + 1)]
    assert len(caps.snapshot(doc(**{field: names[:limit]})).document[field]) == limit
    error = refused(doc(**{field: names}))
    assert (error.code, error.field) == ("capabilities_invalid", field)


def test_runtimes_are_capped_exactly():
    runtimes = [{"name": f"r{i}", "version": "1.0.0"} for i in range(caps.MAX_RUNTIMES + 1)]
    assert len(caps.snapshot(doc(runtimes=runtimes[:-1])).document["runtimes"]) == caps.MAX_RUNTIMES
    assert refused(doc(runtimes=runtimes)).field == "runtimes"


def test_64_labels_pass_and_65_are_refused():
    labels = {f"key-{i}": f"v{i}" for i in range(65)}
    assert len(caps.snapshot(doc(labels=dict(list(labels.items())[:64]))).document["labels"]) == 64
    error = refused(doc(labels=labels))
    assert (error.code, error.field) == ("capabilities_invalid", "labels")


def test_gpu_devices_are_capped_by_their_total_count():
    gpu = {"vendor": "nvidia", "model": "A100", "memoryMiB": 40960, "features": []}
    assert caps.snapshot(doc(gpus=[{**gpu, "count": 16}])).document["gpus"][0]["count"] == 16
    error = refused(doc(gpus=[{**gpu, "count": 10}, {**gpu, "model": "H100", "count": 7}]))
    assert error.field == "gpus[1].count"
    assert refused(doc(gpus=[{**gpu, "count": 0}])).field == "gpus[0].count"


def test_identical_gpus_are_one_entry_with_a_count_and_duplicates_are_refused():
    gpu = {"vendor": "nvidia", "model": "A100", "memoryMiB": 40960, "features": ["cuda12"]}
    error = refused(doc(gpus=[gpu, dict(gpu)]))
    assert error.field == "gpus[1]" and "count" in error.message
    assert caps.snapshot(doc(gpus=[{**gpu, "count": 2}])).document["gpus"] == [{**gpu, "count": 2}]


def test_gpu_features_are_capped():
    gpu = {
        "vendor": "nvidia",
        "model": "A100",
        "memoryMiB": 1,
        "features": [f"f{i}" for i in range(caps.MAX_GPU_FEATURES + 1)],
    }
    assert refused(doc(gpus=[gpu])).field == "gpus[0].features"


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("zone", "eu-1", True),
        ("topology.kubernetes.io/zone", "EU_West.1", True),
        ("a", "B", True),
        ("k" * 63, "v" * 63, True),
        ("k" * 64, "v", False),
        ("zone", "v" * 64, False),
        ("Zone", "eu", False),
        ("zone", "eu 1", False),
        ("zone", "", False),
        ("", "x", False),
        ("-zone", "x", False),
        ("zone-", "x", False),
        ("zone", "-x", False),
        ("zone", "x\u00e9", False),
        ("zo\u0000ne", "x", False),
        ("zone", "a/b", False),
    ],
)
def test_label_rule(key, value, ok):
    if ok:
        assert caps.snapshot(doc(labels={key: value})).document["labels"] == {key: value}
    else:
        error = refused(doc(labels={key: value}))
        assert error.field == "labels." + strictjson.display_key(key)
        assert error.message == caps.LABEL_RULE


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("3.11.7", True),
        ("2.2.0-rc.1", True),
        ("1.0.0+build.5", True),
        ("0.0.0", True),
        ("1.0.0-alpha.beta-1", True),
        ("1.2", False),
        ("v1.2.3", False),
        ("=1.2.3", False),
        ("01.2.3", False),
        ("1.2.3-01", False),
        ("1.2.3\n", False),
        (" 1.2.3", False),
        ("1.2.3-", False),
        ("\u0661.2.3", False),
        ("1" * 17 + ".0.0", False),
        ("1.0.0-" + "a" * 60, False),
        (3, False),
        (None, False),
    ],
)
def test_runtime_versions_are_exact_semver(version, ok):
    document = doc(runtimes=[{"name": "python", "version": version}])
    if ok:
        assert caps.snapshot(document).document["runtimes"][0]["version"] == version
    else:
        assert refused(document).field == "runtimes[0].version"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memoryMiB", -1),
        ("memoryMiB", caps.MAX_MEMORY_MIB + 1),
        ("diskMiB", caps.MAX_DISK_MIB + 1),
        ("cpuCount", 0),
        ("cpuCount", caps.MAX_CPU_COUNT + 1),
        ("cpuCount", True),
        ("memoryMiB", 1.0),
        ("memoryMiB", float("nan")),
        ("diskMiB", float("inf")),
        ("cpuCount", "2"),
        ("cpuCount", None),
    ],
)
def test_numbers_out_of_range_or_of_the_wrong_type_are_refused(field, value):
    error = refused(doc(**{field: value}))
    assert (error.code, error.field) == ("capabilities_invalid", field)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"extra": 1}, "extra"),
        ({"runtimes": [{"name": "python", "version": "3.11.7", "path": "/x"}]}, "runtimes[0].path"),
        (
            {"gpus": [{"vendor": "nvidia", "model": "A100", "memoryMiB": 1, "features": [], "bus": "0"}]},
            "gpus[0].bus",
        ),
    ],
)
def test_unknown_fields_are_refused_at_every_level(change, field):
    error = refused(doc(**change))
    assert (error.field, error.message) == (field, "unknown field")


def test_non_string_keys_from_python_callers_are_refused_not_crashed():
    assert refused({**doc(), 1: "x", "zz": 2}).field == "1"
    assert refused(doc(labels={1: "x"})).field == "labels.1"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"executors": []}, "executors"),
        ({"executors": ["shell", "shell"]}, "executors[1]"),
        ({"features": ["a", "b", "a"]}, "features[2]"),
        (
            {"runtimes": [{"name": "go", "version": "1.22.0"}, {"name": "go", "version": "1.21.0"}]},
            "runtimes[1].name",
        ),
        ({"gpus": [{"vendor": "nvidia", "model": " A100", "memoryMiB": 1, "features": []}]}, "gpus[0].model"),
        (
            {"gpus": [{"vendor": "nvidia", "model": "A\x00100", "memoryMiB": 1, "features": []}]},
            "gpus[0].model",
        ),
        (
            {"gpus": [{"vendor": "nvidia", "model": "A100", "memoryMiB": 1, "features": ["cuda", "cuda"]}]},
            "gpus[0].features[1]",
        ),
        ({"labels": {"zone": {"nested": "x"}}}, "labels.zone"),
        ({"features": [["docker"]]}, "features[0]"),
        ({"arch": "sparc"}, "arch"),
        ({"os": None}, "os"),
        ({"executors": ["Shell"]}, "executors[0]"),
        ({"executors": ["sh\tell"]}, "executors[0]"),
    ],
)
def test_shape_rules(change, field):
    assert refused(doc(**change)).field == field


def test_snapshot_must_be_an_object():
    assert refused([BASE]).field == "capabilities"


def test_canonical_snapshot_of_exactly_16_kib_passes_and_one_byte_more_is_refused():
    at_limit = caps.snapshot(snapshot_of_size(caps.MAX_SNAPSHOT_BYTES))
    assert len(at_limit.canonical) == caps.MAX_SNAPSHOT_BYTES
    error = refused(snapshot_of_size(caps.MAX_SNAPSHOT_BYTES + 1))
    assert (error.code, error.field) == ("capabilities_too_large", "capabilities")
    assert str(caps.MAX_SNAPSHOT_BYTES + 1) in error.message


def test_snapshot_is_idempotent_and_sorted():
    first = caps.snapshot(
        doc(executors=["shell", "python"], features=["b", "a"], labels={"z": "1", "a": "2"})
    )
    assert first.document["executors"] == ["python", "shell"] and first.document["features"] == ["a", "b"]
    again = caps.snapshot(first.document)
    assert (again.canonical, again.sha256) == (first.canonical, first.sha256)
