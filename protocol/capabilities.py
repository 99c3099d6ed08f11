"""Worker capability snapshots: strict schema, canonical form, digest (ADR-0012 §2, §4).

Shared by the agent (which builds and checks its own snapshot) and the control plane (which
refuses anything else). The wire shape, all keys required unless marked optional::

    {
      "arch": "x86_64",                    # canonical name; aliases normalised (ARCH_ALIASES)
      "os": "linux",                       # OS_NAMES; aliases normalised
      "executors": ["python", "shell"],    # set of NAME, 1..MAX_EXECUTORS
      "runtimes": [{"name": "python", "version": "3.11.7"}],  # set by name, exact semver
      "labels": {"zone": "eu-1"},          # LABEL_KEY -> LABEL_VALUE, at most MAX_LABELS
      "memoryMiB": 2048, "diskMiB": 10240, "cpuCount": 2,
      "gpus": [{"vendor": "nvidia", "model": "A100", "memoryMiB": 40960, "features": ["cuda12"]}],
      "features": ["docker"]               # set of NAME, at most MAX_FEATURES
    }

Rules: unknown keys at any level, wrong types (``true`` is not a number), control characters,
duplicate list entries, numbers out of range, nesting deeper than the shape, and a canonical
form over :data:`MAX_SNAPSHOT_BYTES` are refused with a :class:`ProtocolError` naming the field
(``capabilities_invalid`` / ``capabilities_too_large``). Duplicate keys, NaN/Infinity and lone
surrogates are refused earlier by :mod:`protocol.strictjson`.

Canonical form: sets are sorted (executors, features, GPU features by value; runtimes by name;
GPUs by their own canonical bytes), then RFC 8785 (JCS) serialisation by the ``rfc8785``
package; the digest is SHA-256 of those bytes, lowercase hex. Reordering keys or sets, or
changing whitespace, never changes the bytes.

Label rule: keys are lowercase ``[a-z0-9]`` with inner ``._/-``, 1–63 characters (uppercase is
refused, not folded, so that two spellings can never collide); values are case-sensitive
``[A-Za-z0-9]`` with inner ``._-``, 1–63 characters.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import nodesemver
import rfc8785

from .errors import ProtocolError, join_path

MAX_SNAPSHOT_BYTES = 16 * 1024
MAX_EXECUTORS = 16
MAX_RUNTIMES = 32
MAX_LABELS = 64
MAX_GPUS = 16
MAX_GPU_FEATURES = 32
MAX_FEATURES = 64
MAX_MEMORY_MIB = 1 << 30  # 1 PiB
MAX_DISK_MIB = 1 << 40
MAX_CPU_COUNT = 4096
#: Deepest nesting a snapshot needs: snapshot > gpus > gpu > features.
SNAPSHOT_DEPTH = 4

ARCH_ALIASES = {
    "x86_64": "x86_64", "amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64",
    "aarch64": "aarch64", "arm64": "aarch64", "armv8": "aarch64",
    "armv7l": "armv7l", "armv7": "armv7l", "armhf": "armv7l", "arm": "armv7l",
    "armv6l": "armv6l", "armv6": "armv6l",
    "i686": "i686", "i386": "i686", "x86": "i686", "386": "i686",
    "riscv64": "riscv64", "ppc64le": "ppc64le", "s390x": "s390x",
    "mips": "mips", "mipsel": "mipsel", "mipsle": "mipsel", "mips64": "mips64", "mips64el": "mips64el",
    "loongarch64": "loongarch64", "loong64": "loongarch64",
}  # fmt: skip
ARCHITECTURES = frozenset(ARCH_ALIASES.values())
OS_ALIASES = {
    "linux": "linux", "darwin": "darwin", "macos": "darwin", "osx": "darwin",
    "windows": "windows", "win32": "windows", "freebsd": "freebsd", "openbsd": "openbsd", "netbsd": "netbsd",
}  # fmt: skip
OPERATING_SYSTEMS = frozenset(OS_ALIASES.values())

NAME = re.compile(r"[a-z][a-z0-9_+.-]{0,31}\Z")
LABEL_KEY = re.compile(r"[a-z0-9](?:[a-z0-9._/-]{0,61}[a-z0-9])?\Z")
LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?\Z")
GPU_MODEL = re.compile(r"[\x20-\x7e]{1,64}\Z")  # printable ASCII, no control characters

_KEYS = {"arch", "os", "executors", "runtimes", "labels", "memoryMiB", "diskMiB", "cpuCount", "gpus", "features"}
_RUNTIME_KEYS = {"name", "version"}
_GPU_KEYS = {"vendor", "model", "memoryMiB", "features"}


def _fail(field: str, message: str) -> ProtocolError:
    return ProtocolError("capabilities_invalid", message, field)


def _exact_keys(doc: Any, allowed: set[str], field: str | None) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise _fail(field or "capabilities", "must be an object")
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise _fail(join_path(field, unknown[0]), "unknown field")
    missing = sorted(allowed - set(doc))
    if missing:
        raise _fail(join_path(field, missing[0]), "required field is missing")
    return doc


def _integer(value: Any, field: str, low: int, high: int) -> int:
    if type(value) is not int:  # bool is an int subclass; refuse it
        raise _fail(field, "must be an integer")
    if not low <= value <= high:
        raise _fail(field, f"must be between {low} and {high}")
    return value


def _name(value: Any, field: str, pattern: re.Pattern[str] = NAME, what: str = "name") -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise _fail(field, f"must be a {what} matching {pattern.pattern.removesuffix(chr(92) + 'Z')}")
    return value


def _name_set(value: Any, field: str, limit: int) -> list[str]:
    if not isinstance(value, list):
        raise _fail(field, "must be an array")
    if len(value) > limit:
        raise _fail(field, f"at most {limit} entries")
    names = [_name(item, join_path(field, index)) for index, item in enumerate(value)]
    if len(set(names)) != len(names):
        raise _fail(field, "duplicate entry")
    return sorted(names)


def normalise_arch(value: Any, field: str = "arch") -> str:
    """Canonical architecture name for ``value`` (``amd64`` -> ``x86_64``); refuses unknown names."""
    if not isinstance(value, str) or value.lower() not in ARCH_ALIASES:
        raise _fail(field, f"unknown architecture; use one of {', '.join(sorted(ARCHITECTURES))}")
    return ARCH_ALIASES[value.lower()]


def normalise_os(value: Any, field: str = "os") -> str:
    """Canonical operating-system name (``macos`` -> ``darwin``); refuses unknown names."""
    if not isinstance(value, str) or value.lower() not in OS_ALIASES:
        raise _fail(field, f"unknown operating system; use one of {', '.join(sorted(OPERATING_SYSTEMS))}")
    return OS_ALIASES[value.lower()]


def is_semver(value: str) -> bool:
    """True for an exact, strict semantic version (``1.2.3``, ``2.2.0-rc.1``; not ``v1.2``)."""
    parsed = nodesemver.valid(value, loose=False)
    # node-semver also accepts a leading "v" or "="; an exact version starts with its major.
    return parsed is not None and value[:1].isdigit() and parsed.raw == value


def _runtimes(value: Any, field: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise _fail(field, "must be an array")
    if len(value) > MAX_RUNTIMES:
        raise _fail(field, f"at most {MAX_RUNTIMES} entries")
    result = []
    for index, item in enumerate(value):
        item_field = join_path(field, index)
        item = _exact_keys(item, _RUNTIME_KEYS, item_field)
        name = _name(item["name"], join_path(item_field, "name"))
        version = item["version"]
        if not isinstance(version, str) or len(version) > 64 or not is_semver(version):
            raise _fail(join_path(item_field, "version"), "must be an exact semantic version such as 3.11.7")
        result.append({"name": name, "version": version})
    names = [r["name"] for r in result]
    if len(set(names)) != len(names):
        raise _fail(field, "duplicate runtime name")
    return sorted(result, key=lambda r: r["name"])


def _labels(value: Any, field: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _fail(field, "must be an object")
    if len(value) > MAX_LABELS:
        raise _fail(field, f"at most {MAX_LABELS} labels")
    for key, label in value.items():
        _name(key, join_path(field, key), LABEL_KEY, "lowercase label key")
        _name(label, join_path(field, key), LABEL_VALUE, "label value")
    return dict(value)


def _gpus(value: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail(field, "must be an array")
    if len(value) > MAX_GPUS:
        raise _fail(field, f"at most {MAX_GPUS} entries")
    result = []
    for index, item in enumerate(value):
        item_field = join_path(field, index)
        item = _exact_keys(item, _GPU_KEYS, item_field)
        model = item["model"]
        if not isinstance(model, str) or not GPU_MODEL.match(model):
            raise _fail(join_path(item_field, "model"), "must be 1-64 printable ASCII characters")
        result.append(
            {
                "vendor": _name(item["vendor"], join_path(item_field, "vendor")),
                "model": model,
                "memoryMiB": _integer(item["memoryMiB"], join_path(item_field, "memoryMiB"), 0, MAX_MEMORY_MIB),
                "features": _name_set(item["features"], join_path(item_field, "features"), MAX_GPU_FEATURES),
            }
        )
    keyed = sorted(result, key=canonical_bytes)
    if len({canonical_bytes(g) for g in keyed}) != len(keyed):
        raise _fail(field, "duplicate GPU entry")
    return keyed


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of ``value`` (which must already be normalised)."""
    return rfc8785.dumps(value)


@dataclass(frozen=True)
class CapabilitySnapshot:
    """A validated, normalised snapshot: ``document`` (dict), its canonical bytes and SHA-256."""

    document: dict[str, Any]
    canonical: bytes
    sha256: str

    @property
    def canonical_text(self) -> str:
        return self.canonical.decode("utf-8")


def normalise(doc: Any) -> dict[str, Any]:
    """Validate a parsed snapshot and return its normalised form (sets sorted, aliases mapped).

    Raises :class:`ProtocolError` (``capabilities_invalid``) naming the first bad field.
    """
    doc = _exact_keys(doc, _KEYS, None)
    return {
        "arch": normalise_arch(doc["arch"]),
        "os": normalise_os(doc["os"]),
        "executors": _nonempty(_name_set(doc["executors"], "executors", MAX_EXECUTORS), "executors"),
        "runtimes": _runtimes(doc["runtimes"], "runtimes"),
        "labels": _labels(doc["labels"], "labels"),
        "memoryMiB": _integer(doc["memoryMiB"], "memoryMiB", 0, MAX_MEMORY_MIB),
        "diskMiB": _integer(doc["diskMiB"], "diskMiB", 0, MAX_DISK_MIB),
        "cpuCount": _integer(doc["cpuCount"], "cpuCount", 1, MAX_CPU_COUNT),
        "gpus": _gpus(doc["gpus"], "gpus"),
        "features": _name_set(doc["features"], "features", MAX_FEATURES),
    }


def _nonempty(values: list[str], field: str) -> list[str]:
    if not values:
        raise _fail(field, "at least one executor is required")
    return values


def snapshot(doc: Any) -> CapabilitySnapshot:
    """Validate, normalise and canonicalise a parsed snapshot (ADR-0012 §4).

    Raises :class:`ProtocolError`: ``capabilities_invalid`` with the field path, or
    ``capabilities_too_large`` when the canonical bytes exceed 16 KiB.
    """
    document = normalise(doc)
    canonical = canonical_bytes(document)
    if len(canonical) > MAX_SNAPSHOT_BYTES:
        raise ProtocolError(
            "capabilities_too_large",
            f"canonical snapshot is {len(canonical)} bytes; the limit is {MAX_SNAPSHOT_BYTES}",
            "capabilities",
        )
    return CapabilitySnapshot(document, canonical, hashlib.sha256(canonical).hexdigest())
