"""PlacementSpec: what a task revision requires of a worker and what it prefers (ADR-0012 §4).

Validated and normalised once, when the immutable task revision is created
(``actions.tasks.task_create``/``revision_create``); the normalised form is stored as RFC 8785
JSON with its SHA-256 and never rewritten. Wire shape (every key optional on input — absent or
``null`` means "no constraint"; the normalised form has them all)::

    {
      "required": {
        "executor": "shell",                   # set from the revision's executor
        "arch": ["x86_64", "aarch64"],         # any of (aliases normalised); [] = any
        "os": ["linux"],                       # any of; [] = any
        "runtimes": {"python": ">=3.9 <4"},    # every runtime, npm-style semver range
        "labels": {"zone": "eu-1"},            # every key with exactly this value
        "minMemoryMiB": 512, "minDiskMiB": 1024,
        "gpu": {"vendor": "nvidia", "count": 1, "minMemoryMiB": 0, "features": ["cuda12"]}  # or null
      },
      "preferred": {"labels": [{"key": "zone", "value": "eu-1", "weight": 50}]}   # weights 1..100
    }

Caps: ``required.arch`` ≤ 16, ``required.os`` ≤ 8, ``required.runtimes`` ≤ 16 (ranges of 1–128
characters), ``required.labels`` ≤ 32, ``required.gpu.features`` ≤ 16, ``required.gpu.count``
1–16, ``preferred.labels`` ≤ :data:`MAX_PREFERRED_LABELS` (16) entries with weights 1–100, the
normalised document ≤ 8 KiB. Labels follow ``protocol.capabilities.LABEL_RULE``. Unknown keys
at any level, wrong types, duplicates, control characters and oversize sets are refused.

Semver ranges are parsed by the maintained ``node-semver`` package with npm's rules (``^``,
``~``, x-ranges, hyphen ranges, ``||``); they are written in printable ASCII with single spaces
(runs of spaces are collapsed, ends trimmed) and every ``||`` alternative must be non-empty.
Prerelease rule (npm's): a prerelease version satisfies a range only if a comparator in the
same ``||`` set names a prerelease of the same major.minor.patch — ``2.2.0-rc.1`` does *not*
satisfy ``>=2.0.0`` but does satisfy ``>=2.2.0-rc.0``. Partial versions compare numerically:
``2.10.0`` satisfies ``>=2.9``.

Errors are :class:`ProtocolError` ``placement_invalid`` whose ``field`` is a path inside the
placement (``required.runtimes.python``), or ``None`` for the placement as a whole; the runs
service prefixes it with ``placement``.
"""

from __future__ import annotations

import re
from typing import Any

import nodesemver

from protocol.capabilities import (
    LABEL_KEY,
    LABEL_RULE,
    LABEL_VALUE,
    MAX_DISK_MIB,
    MAX_MEMORY_MIB,
    NAME,
    CanonicalDocument,
    normalise_arch,
    normalise_os,
)
from protocol.errors import ProtocolError, join_path
from protocol.strictjson import display_key

MAX_ARCHES = 16
MAX_OS = 8
MAX_RUNTIME_REQUIREMENTS = 16
MAX_REQUIRED_LABELS = 32
MAX_GPU_FEATURES = 16
MAX_GPU_COUNT = 16
MAX_PREFERRED_LABELS = 16
MAX_WEIGHT = 100
MAX_RANGE_LENGTH = 128
MAX_PLACEMENT_BYTES = 8 * 1024

_TOP = {"required", "preferred"}
_REQUIRED = {"executor", "arch", "os", "runtimes", "labels", "minMemoryMiB", "minDiskMiB", "gpu"}
_GPU = {"vendor", "count", "minMemoryMiB", "features"}
_PREFERRED = {"labels"}
_PREFERRED_LABEL = {"key", "value", "weight"}
#: What a semver range may be written with: npm range syntax in printable ASCII, spaces only.
_RANGE_TEXT = re.compile(r"[0-9A-Za-z.+\-<>=~^*| ]+\Z")
_SPACES = re.compile(r" +")
#: A number in a range has at most 16 digits, like every number of a reported version
#: (``protocol.capabilities.SEMVER``): a longer one could never be compared with a real version.
_LONG_NUMBER = re.compile(r"[0-9]{17}")


def _fail(field: str | None, message: str) -> ProtocolError:
    return ProtocolError("placement_invalid", message, field)


def _object(doc: Any, allowed: set[str], field: str | None) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _fail(field, "must be an object")
    unknown = sorted((key for key in doc if key not in allowed), key=display_key)
    if unknown:
        raise _fail(join_path(field, display_key(unknown[0])), "unknown field")
    return doc


def _mapping(doc: Any, field: str, limit: int) -> dict[Any, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _fail(field, "must be an object")
    if len(doc) > limit:
        raise _fail(field, f"at most {limit} entries")
    return doc


def _list(doc: Any, field: str, limit: int) -> list[Any]:
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise _fail(field, "must be an array")
    if len(doc) > limit:
        raise _fail(field, f"at most {limit} entries")
    return doc


def _int(value: Any, field: str, low: int, high: int, default: int | None) -> int:
    if value is None and default is not None:
        return default
    if type(value) is not int or not low <= value <= high:
        raise _fail(field, f"must be an integer between {low} and {high}")
    return value


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise _fail(field, "must be a lowercase name matching [a-z][a-z0-9_+.-]{0,31}")
    return value


def _unique_sorted(values: list[str], field: str) -> list[str]:
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            raise _fail(join_path(field, index), f"duplicate entry {value!r}")
        seen.add(value)
    return sorted(values)


def _label_key(key: Any, field: str) -> str:
    if not isinstance(key, str) or not LABEL_KEY.match(key):
        raise _fail(field, LABEL_RULE)
    return key


def _label_value(value: Any, field: str) -> str:
    if not isinstance(value, str) or not LABEL_VALUE.match(value):
        raise _fail(field, LABEL_RULE)
    return value


def valid_range(value: Any, field: str) -> str:
    """Return the normalised text of the npm-style semver range ``value`` (ADR-0012 §4).

    ``value``: 1–128 characters of ``[0-9A-Za-z.+-<>=~^*|]`` and spaces, numbers of at most 16
    digits, for example ``>=3.9 <4`` or ``^18 || ^20``. Runs of spaces collapse to one and the
    ends are trimmed; every ``||`` alternative must hold a comparator. Raises :class:`ProtocolError`
    ``placement_invalid`` at ``field`` for anything else or for text ``node-semver`` rejects.
    """
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_RANGE_LENGTH:
        raise _fail(field, f"must be a semver range of 1-{MAX_RANGE_LENGTH} characters")
    if not _RANGE_TEXT.match(value):
        raise _fail(field, "a semver range holds only [0-9A-Za-z.+-<>=~^*|] and spaces")
    if _LONG_NUMBER.search(value):
        raise _fail(field, "a number in a semver range has at most 16 digits")
    text = _SPACES.sub(" ", value).strip()
    if any(not alternative.strip() for alternative in text.split("||")):
        raise _fail(field, f"{text!r} has an empty || alternative")
    try:
        parsed = nodesemver.valid_range(text, loose=False)
    except Exception:  # node-semver raises assorted ValueError/TypeError subclasses on odd input
        parsed = None
    if parsed is None:
        raise _fail(field, f"{text!r} is not a valid semver range")
    return text


def _gpu(doc: Any) -> dict[str, Any] | None:
    if doc is None:
        return None
    raw = _object(doc, _GPU, "required.gpu")
    features = _list(raw.get("features"), "required.gpu.features", MAX_GPU_FEATURES)
    return {
        "vendor": _name(raw["vendor"], "required.gpu.vendor") if raw.get("vendor") is not None else None,
        "count": _int(raw.get("count"), "required.gpu.count", 1, MAX_GPU_COUNT, 1),
        "minMemoryMiB": _int(raw.get("minMemoryMiB"), "required.gpu.minMemoryMiB", 0, MAX_MEMORY_MIB, 0),
        "features": _unique_sorted(
            [_name(f, join_path("required.gpu.features", i)) for i, f in enumerate(features)],
            "required.gpu.features",
        ),
    }


def _required(doc: Any, executor: str) -> dict[str, Any]:
    doc = _object(doc, _REQUIRED, "required")
    if doc.get("executor") is not None and doc["executor"] != executor:
        raise _fail("required.executor", f"must be the revision's executor {executor!r} or left out")
    arches = _list(doc.get("arch"), "required.arch", MAX_ARCHES)
    oses = _list(doc.get("os"), "required.os", MAX_OS)
    runtimes = _mapping(doc.get("runtimes"), "required.runtimes", MAX_RUNTIME_REQUIREMENTS)
    labels = _mapping(doc.get("labels"), "required.labels", MAX_REQUIRED_LABELS)
    normalised_runtimes = {}
    for name, version_range in runtimes.items():
        field = join_path("required.runtimes", display_key(name))
        normalised_runtimes[_name(name, field)] = valid_range(version_range, field)
    normalised_labels = {}
    for key, value in labels.items():
        field = join_path("required.labels", display_key(key))
        normalised_labels[_label_key(key, field)] = _label_value(value, field)
    return {
        "executor": executor,
        "arch": _unique_sorted(
            [_normalise_arch(a, join_path("required.arch", i)) for i, a in enumerate(arches)], "required.arch"
        ),
        "os": _unique_sorted(
            [_normalise_os(o, join_path("required.os", i)) for i, o in enumerate(oses)], "required.os"
        ),
        "runtimes": dict(sorted(normalised_runtimes.items())),
        "labels": dict(sorted(normalised_labels.items())),
        "minMemoryMiB": _int(doc.get("minMemoryMiB"), "required.minMemoryMiB", 0, MAX_MEMORY_MIB, 0),
        "minDiskMiB": _int(doc.get("minDiskMiB"), "required.minDiskMiB", 0, MAX_DISK_MIB, 0),
        "gpu": _gpu(doc.get("gpu")),
    }


def _normalise_arch(value: Any, field: str) -> str:
    try:
        return normalise_arch(value, field)
    except ProtocolError as exc:
        raise _fail(field, exc.message) from None


def _normalise_os(value: Any, field: str) -> str:
    try:
        return normalise_os(value, field)
    except ProtocolError as exc:
        raise _fail(field, exc.message) from None


def _preferred(doc: Any) -> dict[str, Any]:
    doc = _object(doc, _PREFERRED, "preferred")
    entries = []
    seen: set[tuple[str, str]] = set()
    for index, entry in enumerate(_list(doc.get("labels"), "preferred.labels", MAX_PREFERRED_LABELS)):
        field = join_path("preferred.labels", index)
        if entry is None:
            raise _fail(field, "must be an object")
        entry = _object(entry, _PREFERRED_LABEL, field)
        for required_key in ("key", "value", "weight"):
            if required_key not in entry:
                raise _fail(join_path(field, required_key), "required field is missing")
        key = _label_key(entry["key"], join_path(field, "key"))
        value = _label_value(entry["value"], join_path(field, "value"))
        weight = _int(entry["weight"], join_path(field, "weight"), 1, MAX_WEIGHT, None)
        if (key, value) in seen:
            raise _fail(field, "duplicate key/value entry")
        seen.add((key, value))
        entries.append({"key": key, "value": value, "weight": weight})
    return {"labels": sorted(entries, key=lambda e: (e["key"], e["value"]))}


class PlacementSpec(CanonicalDocument):
    """A normalised placement (stored in ``TaskRevision.placement``): document, bytes, SHA-256."""


def normalise(doc: Any, *, executor: str) -> PlacementSpec:
    """Validate a parsed placement for a revision running on ``executor``; return it normalised.

    ``doc``: the parsed JSON object (shape and caps in the module docstring); ``executor``: the
    revision's executor name, written into ``required.executor``. Returns the normalised
    document (every key present, sets sorted, aliases mapped, ranges whitespace-normalised), its
    RFC 8785 bytes and SHA-256. Idempotent: normalising ``spec.document`` again gives the same
    bytes. Called once per revision (ADR-0012 §4: "the placement is normalised once").

    Raises :class:`ProtocolError` (``placement_invalid``) naming the first bad field: unknown
    fields at any level, wrong types, oversize sets, invalid semver ranges, weights outside
    1–100, a normalised document over 8 KiB (field ``None``). Never raises anything else.
    """
    doc = _object(doc, _TOP, None)
    document = {
        "required": _required(doc.get("required"), executor),
        "preferred": _preferred(doc.get("preferred")),
    }
    result = PlacementSpec.of(document)
    if len(result.canonical) > MAX_PLACEMENT_BYTES:
        raise _fail(
            None, f"normalised placement is {len(result.canonical)} bytes; the limit is {MAX_PLACEMENT_BYTES}"
        )
    return result
