"""Hypothesis strategies for capability snapshots and placements, valid and surely invalid.

Shared by the pure tests (tests/protocol, tests/placement) and the HTTP tests (tests/placement).
Every invalid case comes with the field the refusal must name, so a test can check the 4xx
names the right place, not merely that something was refused.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from protocol import capabilities as caps

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
LABEL_KEYS = st.from_regex(r"[a-z0-9](?:[a-z0-9._/-]{0,6}[a-z0-9])?", fullmatch=True)
LABEL_VALUES = st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,6}[A-Za-z0-9])?", fullmatch=True)
PRERELEASE = st.sampled_from(["", "-rc.1", "-alpha", "-0.3.7", "-beta.11"])
BUILD = st.sampled_from(["", "", "+build.5"])


@st.composite
def versions(draw) -> str:
    major, minor, patch = (draw(st.integers(0, 30)) for _ in range(3))
    return f"{major}.{minor}.{patch}{draw(PRERELEASE)}{draw(BUILD)}"


@st.composite
def gpus(draw) -> dict[str, Any]:
    gpu = {
        "vendor": draw(st.sampled_from(["nvidia", "amd", "intel"])),
        "model": draw(st.sampled_from(["A100", "H100 SXM", "RX 7900", "Arc A770"])),
        "memoryMiB": draw(st.integers(0, 81920)),
        "features": draw(
            st.lists(
                st.sampled_from(["cuda11", "cuda12", "fp16", "rocm6", "tensor"]), unique=True, max_size=3
            )
        ),
    }
    if draw(st.booleans()):
        gpu["count"] = draw(st.integers(1, 4))
    return gpu


def _unique_gpus(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, kept, devices = set(), [], 0
    for gpu in items:
        identity = json.dumps(
            {k: sorted(v) if k == "features" else v for k, v in gpu.items() if k != "count"}, sort_keys=True
        )
        if identity in seen or devices + gpu.get("count", 1) > caps.MAX_GPUS:
            continue
        seen.add(identity)
        devices += gpu.get("count", 1)
        kept.append(gpu)
    return kept


@st.composite
def snapshot_docs(draw) -> dict[str, Any]:
    """A valid snapshot document as a worker would send it (aliases allowed, sets unordered)."""
    return {
        "arch": draw(st.sampled_from(sorted(caps.ARCH_ALIASES))),
        "os": draw(st.sampled_from(sorted(caps.OS_ALIASES))),
        "executors": draw(
            st.lists(st.sampled_from(["shell", "python", "node", "docker"]), unique=True, min_size=1)
        ),
        "runtimes": [
            {"name": name, "version": draw(versions())}
            for name in draw(
                st.lists(st.sampled_from(["python", "node", "bash", "go"]), unique=True, max_size=4)
            )
        ],
        "labels": draw(st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=6)),
        "memoryMiB": draw(st.integers(0, caps.MAX_MEMORY_MIB)),
        "diskMiB": draw(st.integers(0, caps.MAX_DISK_MIB)),
        "cpuCount": draw(st.integers(1, caps.MAX_CPU_COUNT)),
        "gpus": _unique_gpus(draw(st.lists(gpus(), max_size=4))),
        "features": draw(st.lists(NAMES, unique=True, max_size=5)),
    }


def reordered(draw, doc: Any) -> Any:
    """``doc`` with every object's keys and every list shuffled (sets are unordered on the wire)."""
    if isinstance(doc, dict):
        keys = draw(st.permutations(list(doc)))
        return {key: reordered(draw, doc[key]) for key in keys}
    if isinstance(doc, list):
        return [reordered(draw, item) for item in draw(st.permutations(doc))]
    return doc


def respelled_aliases(draw, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with arch and os written as another alias of the same canonical name, in any case."""
    arch = caps.ARCH_ALIASES[doc["arch"]]
    os_name = caps.OS_ALIASES[doc["os"]]
    same_arch = sorted(alias for alias, canonical in caps.ARCH_ALIASES.items() if canonical == arch)
    same_os = sorted(alias for alias, canonical in caps.OS_ALIASES.items() if canonical == os_name)
    upper = draw(st.booleans())
    pick_arch, pick_os = draw(st.sampled_from(same_arch)), draw(st.sampled_from(same_os))
    return {
        **doc,
        "arch": pick_arch.upper() if upper else pick_arch,
        "os": pick_os.upper() if upper else pick_os,
    }


def rewhitespaced(draw, doc: Any) -> str:
    """``doc`` serialised with arbitrary JSON whitespace and ASCII escaping."""
    indent = draw(st.sampled_from([None, 0, 1, 4, "\t"]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : "), (",\n", ":\t")]))
    return json.dumps(doc, indent=indent, separators=separators, ensure_ascii=draw(st.booleans()))


def snapshot_of_size(total: int) -> dict[str, Any]:
    """A valid-shaped snapshot document whose canonical form is exactly ``total`` bytes (> ~3 KiB).

    Sixteen GPUs with long models and feature names pad it; feature names are then shortened
    one character at a time until the size matches.
    """
    document = {
        "arch": "x86_64",
        "os": "linux",
        "executors": ["shell"],
        "runtimes": [],
        "labels": {},
        "memoryMiB": 256,
        "diskMiB": 1024,
        "cpuCount": 1,
        "features": [],
        "gpus": [
            {
                "vendor": "nvidia",
                "model": f"M{i:02d}" + "x" * 61,
                "memoryMiB": 1,
                "features": [f"f{j:02d}" + "y" * 28 for j in range(caps.MAX_GPU_FEATURES)],
            }
            for i in range(16)
        ],
    }
    excess = len(caps.canonical_bytes(caps.normalise(document))) - total
    if excess < 0:
        raise ValueError(f"cannot pad a snapshot to {total} bytes")
    for gpu in document["gpus"]:
        for index, feature in enumerate(gpu["features"]):
            cut = min(excess, len(feature) - 3)
            gpu["features"][index] = feature[: len(feature) - cut]
            excess -= cut
    if excess:
        raise ValueError(f"cannot shrink a snapshot to {total} bytes")
    return document


# --- surely invalid snapshots ----------------------------------------------------------------------

Mutation = Callable[[Any, dict[str, Any]], tuple[dict[str, Any], str, str]]


def _unknown_top(draw, doc):
    key = draw(st.sampled_from(["extra", "Arch", "memory_mib", "labelz"]))
    return {**doc, key: 1}, key, "capabilities_invalid"


def _unknown_in_runtime(draw, doc):
    doc = {**doc, "runtimes": [{"name": "python", "version": "3.11.7", "path": "/usr/bin/python3"}]}
    return doc, "runtimes[0].path", "capabilities_invalid"


def _unknown_in_gpu(draw, doc):
    gpu = {"vendor": "nvidia", "model": "A100", "memoryMiB": 1, "features": [], "uuid": "GPU-1"}
    return {**doc, "gpus": [gpu]}, "gpus[0].uuid", "capabilities_invalid"


def _missing(draw, doc):
    key = draw(st.sampled_from(sorted(doc)))
    rest = {k: v for k, v in doc.items() if k != key}
    return rest, key, "capabilities_invalid"


def _wrong_number(draw, doc):
    key, low, high = draw(
        st.sampled_from(
            [
                ("memoryMiB", 0, caps.MAX_MEMORY_MIB),
                ("diskMiB", 0, caps.MAX_DISK_MIB),
                ("cpuCount", 1, caps.MAX_CPU_COUNT),
            ]
        )
    )
    value = draw(
        st.one_of(
            st.integers(high + 1, 10**15),
            st.integers(-(10**15), low - 1),
            st.just(True),
            st.just(1.5),
            st.just(str(low)),
            st.just(None),
            st.just([low]),
        )
    )
    return {**doc, key: value}, key, "capabilities_invalid"


def _control_character(draw, doc):
    char = draw(st.sampled_from(["\x00", "\x07", "\n", "\x1b", "\x7f", "\u0085", "\u2028"]))
    target = draw(st.sampled_from(["executors", "features", "model"]))
    if target == "model":
        gpu = {"vendor": "nvidia", "model": f"A1{char}00", "memoryMiB": 1, "features": []}
        return {**doc, "gpus": [gpu]}, "gpus[0].model", "capabilities_invalid"
    return {**doc, target: [f"ok{char}"]}, f"{target}[0]", "capabilities_invalid"


def _duplicate_entry(draw, doc):
    target = draw(st.sampled_from(["executors", "features", "runtimes", "gpus"]))
    if target == "runtimes":
        items = [{"name": "node", "version": "18.0.0"}, {"name": "node", "version": "20.1.0"}]
        return {**doc, "runtimes": items}, "runtimes[1].name", "capabilities_invalid"
    if target == "gpus":
        gpu = {"vendor": "amd", "model": "RX 7900", "memoryMiB": 24576, "features": ["rocm6"]}
        return (
            {**doc, "gpus": [gpu, {**gpu, "features": ["rocm6"], "count": 2}]},
            "gpus[1]",
            "capabilities_invalid",
        )
    return {**doc, target: ["shell", "python", "shell"]}, f"{target}[2]", "capabilities_invalid"


def _too_many(draw, doc):
    target, limit = draw(
        st.sampled_from(
            [
                ("executors", caps.MAX_EXECUTORS),
                ("features", caps.MAX_FEATURES),
                ("labels", caps.MAX_LABELS),
                ("runtimes", caps.MAX_RUNTIMES),
            ]
        )
    )
    if target == "labels":
        return {**doc, "labels": {f"k{i}": "v" for i in range(limit + 1)}}, "labels", "capabilities_invalid"
    if target == "runtimes":
        return (
            {**doc, "runtimes": [{"name": f"r{i}", "version": "1.0.0"} for i in range(limit + 1)]},
            "runtimes",
            "capabilities_invalid",
        )
    return {**doc, target: [f"n{i}" for i in range(limit + 1)]}, target, "capabilities_invalid"


def _bad_label(draw, doc):
    key, value = draw(
        st.sampled_from(
            [
                ("Zone", "eu"),
                ("zone", "eu 1"),
                ("-zone", "eu"),
                ("zone", ""),
                ("zone", "x" * 64),
                ("k" * 64, "v"),
                ("zone", "eu\x00"),
            ]
        )
    )
    return {**doc, "labels": {key: value}}, f"labels.{key.replace(chr(0), '')}", "capabilities_invalid"


def _bad_version(draw, doc):
    version = draw(
        st.sampled_from(
            [
                "1.2",
                "v1.2.3",
                "01.2.3",
                "1.2.3\n",
                "1.2.3-",
                "latest",
                "",
                "1.2.3.4",
                "1" * 20 + ".0.0",
                "\u0661.2.3",
            ]
        )
    )
    return (
        {**doc, "runtimes": [{"name": "python", "version": version}]},
        "runtimes[0].version",
        "capabilities_invalid",
    )


def _bad_name(draw, doc):
    arch, os_name = draw(
        st.sampled_from([("sparc", "linux"), ("x86_64", "plan9"), ("", "linux"), (64, "linux")])
    )
    return (
        {**doc, "arch": arch, "os": os_name},
        "arch" if arch not in caps.ARCH_ALIASES else "os",
        "capabilities_invalid",
    )


def _too_nested(draw, doc):
    target = draw(st.sampled_from(["labels", "features", "executors", "gpus"]))
    if target == "labels":
        return {**doc, "labels": {"zone": {"eu": "1"}}}, "labels.zone", "capabilities_invalid"
    if target == "gpus":
        gpu = {"vendor": "nvidia", "model": "A100", "memoryMiB": 1, "features": [["cuda12"]]}
        return {**doc, "gpus": [gpu]}, "gpus[0].features[0]", "capabilities_invalid"
    return {**doc, target: [["shell"]]}, f"{target}[0]", "capabilities_invalid"


def _wrong_container(draw, doc):
    target = draw(st.sampled_from(["executors", "runtimes", "labels", "gpus", "features"]))
    value = draw(st.sampled_from(["shell", 1, None, True] + ([["a"]] if target == "labels" else [{}])))
    return {**doc, target: value}, target, "capabilities_invalid"


MUTATIONS: list[Mutation] = [
    _unknown_top,
    _unknown_in_runtime,
    _unknown_in_gpu,
    _missing,
    _wrong_number,
    _control_character,
    _duplicate_entry,
    _too_many,
    _bad_label,
    _bad_version,
    _bad_name,
    _too_nested,
    _wrong_container,
]


@st.composite
def invalid_snapshots(draw) -> tuple[dict[str, Any], str, str]:
    """(surely invalid snapshot document, field the refusal must name, code)."""
    doc = copy.deepcopy(draw(snapshot_docs()))
    mutation = draw(st.sampled_from(MUTATIONS))
    return mutation(draw, doc)


# --- placements ----------------------------------------------------------------------------------


RANGES = st.sampled_from(
    [
        ">=3.9",
        "^3.11",
        "~1.2.3",
        "3.x",
        "*",
        ">=1.0.0 <2.0.0",
        "1.2.3 - 2.3.4",
        "^18 || ^20",
        ">=2.2.0-rc.0",
        "<=0.0.1",
        ">=10",
    ]
)


@st.composite
def placement_docs(draw, *, runtime_names=("python", "node", "bash", "go")) -> dict[str, Any]:
    """A valid placement document as an operator would send it."""
    required: dict[str, Any] = {}
    if draw(st.booleans()):
        required["arch"] = draw(
            st.lists(
                st.sampled_from(["x86_64", "amd64", "aarch64", "arm64", "armv7l"]),
                max_size=2,
                unique_by=lambda a: caps.ARCH_ALIASES[a],
            )
        )
    if draw(st.booleans()):
        required["os"] = draw(
            st.lists(st.sampled_from(["linux", "darwin", "windows"]), unique=True, max_size=2)
        )
    if draw(st.booleans()):
        required["runtimes"] = draw(st.dictionaries(st.sampled_from(runtime_names), RANGES, max_size=2))
    if draw(st.booleans()):
        required["labels"] = draw(st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=2))
    if draw(st.booleans()):
        required["minMemoryMiB"] = draw(st.integers(0, 1 << 20))
    if draw(st.booleans()):
        required["minDiskMiB"] = draw(st.integers(0, 1 << 20))
    if draw(st.booleans()):
        required["gpu"] = {
            "vendor": draw(st.sampled_from(["nvidia", "amd", None])),
            "count": draw(st.integers(1, 4)),
            "features": draw(st.lists(st.sampled_from(["cuda12", "fp16"]), unique=True, max_size=2)),
        }
    preferred = draw(
        st.lists(
            st.fixed_dictionaries({"key": LABEL_KEYS, "value": LABEL_VALUES, "weight": st.integers(1, 100)}),
            max_size=4,
            unique_by=lambda e: (e["key"], e["value"]),
        )
    )
    doc: dict[str, Any] = {}
    if required or draw(st.booleans()):
        doc["required"] = required
    if preferred or draw(st.booleans()):
        doc["preferred"] = {"labels": preferred}
    return doc


def _p_unknown(draw, doc):
    level = draw(st.sampled_from(["top", "required", "gpu", "preferred", "entry"]))
    if level == "top":
        return {**doc, "requird": {}}, "requird"
    if level == "required":
        return {**doc, "required": {"arch": [], "cpuCount": 2}}, "required.cpuCount"
    if level == "gpu":
        return {**doc, "required": {"gpu": {"count": 1, "model": "A100"}}}, "required.gpu.model"
    if level == "preferred":
        return {**doc, "preferred": {"labels": [], "weights": {}}}, "preferred.weights"
    entry = {"key": "zone", "value": "eu", "weight": 5, "boost": 2}
    return {**doc, "preferred": {"labels": [entry]}}, "preferred.labels[0].boost"


def _p_bad_range(draw, doc):
    text = draw(
        st.sampled_from(
            [
                ">=banana",
                "latest",
                "1.2.3.4",
                ">>1",
                "",
                " ",
                "||",
                ">=1 ||",
                "^1\t",
                "1.x\n",
                ">=01.2.3",
                "a" * 129,
                "≥1.0",
                ">=1.0.0\x00",
            ]
        )
    )
    return {**doc, "required": {"runtimes": {"python": text}}}, "required.runtimes.python"


def _p_oversize(draw, doc):
    target = draw(st.sampled_from(["arch", "labels", "runtimes", "preferred", "gpu"]))
    if target == "arch":
        return {**doc, "required": {"arch": ["x86_64"] * 17}}, "required.arch"
    if target == "labels":
        return {**doc, "required": {"labels": {f"k{i}": "v" for i in range(33)}}}, "required.labels"
    if target == "runtimes":
        return {**doc, "required": {"runtimes": {f"r{i}": "*" for i in range(17)}}}, "required.runtimes"
    if target == "gpu":
        return {
            **doc,
            "required": {"gpu": {"features": [f"f{i}" for i in range(17)]}},
        }, "required.gpu.features"
    entries = [{"key": f"k{i}", "value": "v", "weight": 1} for i in range(17)]
    return {**doc, "preferred": {"labels": entries}}, "preferred.labels"


def _p_bad_value(draw, doc):
    case = draw(st.integers(0, 9))
    cases = [
        ({"required": {"arch": ["sparc"]}}, "required.arch[0]"),
        ({"required": {"arch": ["amd64", "x86_64"]}}, "required.arch[1]"),
        ({"required": {"minMemoryMiB": -1}}, "required.minMemoryMiB"),
        ({"required": {"minDiskMiB": 1.5}}, "required.minDiskMiB"),
        ({"required": {"gpu": {"count": 0}}}, "required.gpu.count"),
        ({"required": {"labels": {"Zone": "eu"}}}, "required.labels.Zone"),
        ({"required": {"executor": "node"}}, "required.executor"),
        (
            {"preferred": {"labels": [{"key": "zone", "value": "eu", "weight": 101}]}},
            "preferred.labels[0].weight",
        ),
        (
            {"preferred": {"labels": [{"key": "zone", "value": "eu", "weight": None}]}},
            "preferred.labels[0].weight",
        ),
        ({"preferred": {"labels": [{"key": "zone", "value": "eu"}]}}, "preferred.labels[0].weight"),
    ]
    change, field = cases[case]
    return {**doc, **change}, field


def _p_wrong_type(draw, doc):
    target = draw(st.sampled_from(["required", "preferred", "arch", "runtimes", "labels"]))
    if target in ("required", "preferred"):
        return {**doc, target: draw(st.sampled_from([[], "x", 3, True]))}, target
    return {
        **doc,
        "required": {target: draw(st.sampled_from(["x", 3, True] + ([{}] if target == "arch" else [[]])))},
    }, f"required.{target}"


PLACEMENT_MUTATIONS = [_p_unknown, _p_bad_range, _p_oversize, _p_bad_value, _p_wrong_type]


@st.composite
def invalid_placements(draw) -> tuple[dict[str, Any], str]:
    """(surely invalid placement document for a shell revision, field the refusal must name)."""
    doc = copy.deepcopy(draw(placement_docs()))
    return draw(st.sampled_from(PLACEMENT_MUTATIONS))(draw, doc)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "required",
                    "preferred",
                    "arch",
                    "os",
                    "labels",
                    "runtimes",
                    "gpu",
                    "count",
                    "weight",
                    "key",
                    "value",
                    "x",
                ]
            )
            | st.text(max_size=6),
            children,
            max_size=3,
        )
    ),
    max_leaves=12,
)
