"""PlacementSpec: what a task revision requires of a worker and what it prefers (ADR-0012 §4).

Validated and normalised once, when the immutable task revision is created; the normalised form
is stored as RFC 8785 JSON with its SHA-256 and never rewritten. Wire shape (every key optional
on input; the normalised form has them all)::

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

Semver ranges are parsed by the maintained ``node-semver`` package with npm's rules (``^``,
``~``, x-ranges, hyphen ranges, ``||``). Prerelease rule (npm's): a prerelease version satisfies
a range only if a comparator in the same set names a prerelease of the same major.minor.patch —
``2.2.0-rc.1`` does *not* satisfy ``>=2.0.0`` but does satisfy ``>=2.2.0-rc.0``. Partial versions
compare numerically: ``2.10.0`` satisfies ``>=2.9``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import nodesemver

from protocol.capabilities import (
    LABEL_KEY,
    LABEL_VALUE,
    MAX_MEMORY_MIB,
    NAME,
    canonical_bytes,
    normalise_arch,
    normalise_os,
)
from protocol.errors import ProtocolError, join_path

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
PLACEMENT_DEPTH = 5  # placement > required > gpu > features, or preferred > labels > entry

_TOP = {"required", "preferred"}
_REQUIRED = {"executor", "arch", "os", "runtimes", "labels", "minMemoryMiB", "minDiskMiB", "gpu"}
_GPU = {"vendor", "count", "minMemoryMiB", "features"}
_PREFERRED = {"labels"}
_PREFERRED_LABEL = {"key", "value", "weight"}


def _fail(field: str, message: str) -> ProtocolError:
    return ProtocolError("placement_invalid", message, field)


def _object(doc: Any, allowed: set[str], field: str) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _fail(field, "must be an object")
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise _fail(join_path(field, unknown[0]), "unknown field")
    return doc


def _mapping(doc: Any, field: str, limit: int) -> dict[str, Any]:
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


def _int(value: Any, field: str, low: int, high: int, default: int) -> int:
    if value is None:
        return default
    if type(value) is not int or not low <= value <= high:
        raise _fail(field, f"must be an integer between {low} and {high}")
    return value


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise _fail(field, "must be a lowercase name")
    return value


def _unique_sorted(values: list[str], field: str) -> list[str]:
    if len(set(values)) != len(values):
        raise _fail(field, "duplicate entry")
    return sorted(values)


def valid_range(value: Any, field: str) -> str:
    """Return ``value`` if it is a valid npm-style semver range; raise ``placement_invalid``."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_RANGE_LENGTH:
        raise _fail(field, f"must be a semver range of 1-{MAX_RANGE_LENGTH} characters")
    try:
        parsed = nodesemver.valid_range(value, loose=False)
    except Exception:  # node-semver raises ValueError/TypeError subclasses on odd input
        parsed = None
    if parsed is None:
        raise _fail(field, f"{value!r} is not a valid semver range")
    return value


def _required(doc: Any, executor: str) -> dict[str, Any]:
    field = "required"
    doc = _object(doc, _REQUIRED, field)
    if doc.get("executor") not in (None, executor):
        raise _fail("required.executor", f"must be the revision's executor {executor!r} or left out")
    arches = _list(doc.get("arch"), "required.arch", MAX_ARCHES)
    oses = _list(doc.get("os"), "required.os", MAX_OS)
    runtimes = _mapping(doc.get("runtimes"), "required.runtimes", MAX_RUNTIME_REQUIREMENTS)
    labels = _mapping(doc.get("labels"), "required.labels", MAX_REQUIRED_LABELS)
    for key, value in labels.items():
        if not LABEL_KEY.match(key):
            raise _fail(join_path("required.labels", key), "label keys are lowercase [a-z0-9._/-], 1-63 long")
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            raise _fail(join_path("required.labels", key), "label values are [A-Za-z0-9._-], 1-63 long")
    gpu = None
    if doc.get("gpu") is not None:
        raw = _object(doc["gpu"], _GPU, "required.gpu")
        gpu = {
            "vendor": _name(raw["vendor"], "required.gpu.vendor") if raw.get("vendor") is not None else None,
            "count": _int(raw.get("count"), "required.gpu.count", 1, MAX_GPU_COUNT, 1),
            "minMemoryMiB": _int(raw.get("minMemoryMiB"), "required.gpu.minMemoryMiB", 0, MAX_MEMORY_MIB, 0),
            "features": _unique_sorted(
                [
                    _name(f, join_path("required.gpu.features", i))
                    for i, f in enumerate(_list(raw.get("features"), "required.gpu.features", MAX_GPU_FEATURES))
                ],
                "required.gpu.features",
            ),
        }
    return {
        "executor": executor,
        "arch": _unique_sorted(
            [normalise_arch_field(a, join_path("required.arch", i)) for i, a in enumerate(arches)], "required.arch"
        ),
        "os": _unique_sorted(
            [normalise_os_field(o, join_path("required.os", i)) for i, o in enumerate(oses)], "required.os"
        ),
        "runtimes": {
            _name(name, join_path("required.runtimes", name)): valid_range(rng, join_path("required.runtimes", name))
            for name, rng in runtimes.items()
        },
        "labels": dict(labels),
        "minMemoryMiB": _int(doc.get("minMemoryMiB"), "required.minMemoryMiB", 0, MAX_MEMORY_MIB, 0),
        "minDiskMiB": _int(doc.get("minDiskMiB"), "required.minDiskMiB", 0, 1 << 40, 0),
        "gpu": gpu,
    }


def normalise_arch_field(value: Any, field: str) -> str:
    try:
        return normalise_arch(value, field)
    except ProtocolError as exc:
        raise _fail(field, exc.message) from None


def normalise_os_field(value: Any, field: str) -> str:
    try:
        return normalise_os(value, field)
    except ProtocolError as exc:
        raise _fail(field, exc.message) from None


def _preferred(doc: Any) -> dict[str, Any]:
    doc = _object(doc, _PREFERRED, "preferred")
    entries = []
    for index, entry in enumerate(_list(doc.get("labels"), "preferred.labels", MAX_PREFERRED_LABELS)):
        field = join_path("preferred.labels", index)
        entry = _object(entry, _PREFERRED_LABEL, field)
        for required_key in ("key", "value", "weight"):
            if required_key not in entry:
                raise _fail(join_path(field, required_key), "required field is missing")
        if not isinstance(entry["key"], str) or not LABEL_KEY.match(entry["key"]):
            raise _fail(join_path(field, "key"), "label keys are lowercase [a-z0-9._/-], 1-63 long")
        if not isinstance(entry["value"], str) or not LABEL_VALUE.match(entry["value"]):
            raise _fail(join_path(field, "value"), "label values are [A-Za-z0-9._-], 1-63 long")
        entries.append(
            {
                "key": entry["key"],
                "value": entry["value"],
                "weight": _int(entry["weight"], join_path(field, "weight"), 1, MAX_WEIGHT, 1),
            }
        )
    pairs = [(e["key"], e["value"]) for e in entries]
    if len(set(pairs)) != len(pairs):
        raise _fail("preferred.labels", "duplicate key/value entry")
    return {"labels": sorted(entries, key=lambda e: (e["key"], e["value"]))}


@dataclass(frozen=True)
class PlacementSpec:
    """A normalised placement: ``document`` plus its RFC 8785 bytes and SHA-256."""

    document: dict[str, Any]
    canonical: bytes
    sha256: str

    @property
    def canonical_text(self) -> str:
        return self.canonical.decode("utf-8")


def normalise(doc: Any, *, executor: str) -> PlacementSpec:
    """Validate a parsed placement for a revision running on ``executor``; return it normalised.

    Raises :class:`ProtocolError` (``placement_invalid``) naming the first bad field: unknown
    fields at any level, wrong types, oversize sets, invalid semver ranges, weights outside 1–100.
    """
    doc = _object(doc, _TOP, "placement")
    document = {"required": _required(doc.get("required"), executor), "preferred": _preferred(doc.get("preferred"))}
    canonical = canonical_bytes(document)
    if len(canonical) > MAX_PLACEMENT_BYTES:
        raise _fail("placement", f"normalised placement exceeds {MAX_PLACEMENT_BYTES} bytes")
    return PlacementSpec(document, canonical, hashlib.sha256(canonical).hexdigest())
