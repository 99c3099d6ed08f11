"""Worker capability snapshots: strict schema, canonical form, digest (ADR-0012 §2, §4).

Shared by the agent (which builds and checks its own snapshot) and the control plane (which
refuses anything else). The wire shape; every key is required except ``gpus[].count``::

    {
      "arch": "x86_64",                    # canonical name; aliases normalised (ARCH_ALIASES)
      "os": "linux",                       # OS_NAMES; aliases normalised
      "executors": ["python", "shell"],    # set of NAME, 1..MAX_EXECUTORS
      "runtimes": [{"name": "python", "version": "3.11.7"}],  # set by name, exact SemVer 2.0.0
      "labels": {"zone": "eu-1"},          # LABEL_KEY -> LABEL_VALUE, at most MAX_LABELS
      "memoryMiB": 2048, "diskMiB": 10240, "cpuCount": 2,
      "gpus": [{"vendor": "nvidia", "model": "A100", "memoryMiB": 40960, "features": ["cuda12"],
                "count": 2}],              # identical devices once, with a count (default 1)
      "features": ["docker"]               # set of NAME, at most MAX_FEATURES
    }

Caps (each refused beyond, naming the field):

============== ======================================= ===========================
field          rule                                    cap
============== ======================================= ===========================
executors      NAME, no duplicates, at least one       :data:`MAX_EXECUTORS` (16)
runtimes       NAME + exact SemVer, one per name       :data:`MAX_RUNTIMES` (32)
labels         LABEL_KEY -> LABEL_VALUE                :data:`MAX_LABELS` (64)
gpus           entries; identical devices use count    :data:`MAX_GPUS` (16 devices)
gpus[].features NAME, no duplicates                    :data:`MAX_GPU_FEATURES` (32)
features       NAME, no duplicates                     :data:`MAX_FEATURES` (64)
memoryMiB      integer                                 0 .. 2^30 (1 PiB)
diskMiB        integer                                 0 .. 2^40
cpuCount       integer                                 1 .. 4096
whole snapshot canonical bytes                         :data:`MAX_SNAPSHOT_BYTES` (16 KiB)
============== ======================================= ===========================

Rules: unknown keys at any level, wrong types (``true`` is not a number, ``1.0`` is not an
integer), control characters, duplicate list entries, numbers out of range, nesting deeper than
the shape, and a canonical form over :data:`MAX_SNAPSHOT_BYTES` are refused with a
:class:`ProtocolError` naming the field (``capabilities_invalid`` / ``capabilities_too_large``).
Duplicate keys, NaN/Infinity, ``1e400`` and lone surrogates are refused earlier, when the body is
parsed, by :mod:`protocol.strictjson`.

Canonical form: sets are sorted (executors, features, GPU features by value; runtimes by name;
GPUs by their own canonical bytes), aliases are mapped, then RFC 8785 (JCS) serialisation by the
``rfc8785`` package; the digest is SHA-256 of those bytes, lowercase hex. Reordering keys or
sets, or changing whitespace, never changes the bytes. The bytes are ASCII (every string of the
schema is), so a text column stores them identically on SQLite and PostgreSQL.

Label rule (:data:`LABEL_RULE`): keys are lowercase ``[a-z0-9]`` with inner ``._/-``, 1–63
characters (uppercase is refused, not folded, so that two spellings can never collide); values
are case-sensitive ``[A-Za-z0-9]`` with inner ``._-``, 1–63 characters.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Self

import nodesemver
import rfc8785

from .errors import ProtocolError, join_path
from .strictjson import display_key

MAX_SNAPSHOT_BYTES = 16 * 1024
MAX_EXECUTORS = 16
MAX_RUNTIMES = 32
MAX_LABELS = 64
#: GPU devices in total (the sum of the entries' counts; hence also at most 16 entries).
MAX_GPUS = 16
MAX_GPU_FEATURES = 32
MAX_FEATURES = 64
MAX_MEMORY_MIB = 1 << 30  # 1 PiB
MAX_DISK_MIB = 1 << 40
MAX_CPU_COUNT = 4096
MAX_VERSION_LENGTH = 64
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
LABEL_RULE = (
    "label keys are lowercase [a-z0-9] with inner . _ / -, 1-63 characters; "
    "label values are [A-Za-z0-9] with inner . _ -, 1-63 characters, case-sensitive"
)
#: Printable ASCII without control characters, no leading or trailing space.
GPU_MODEL = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,62}[\x21-\x7e])?\Z")
_NUMBER = r"(?:0|[1-9][0-9]{0,15})"
_PRERELEASE_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
#: Exact SemVer 2.0.0 (semver.org's grammar, ASCII digits only, components of at most 16 digits).
SEMVER = re.compile(
    rf"{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    rf"(?:-{_PRERELEASE_ID}(?:\.{_PRERELEASE_ID})*)?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?\Z"
)

_KEYS = {
    "arch",
    "os",
    "executors",
    "runtimes",
    "labels",
    "memoryMiB",
    "diskMiB",
    "cpuCount",
    "gpus",
    "features",
}
_RUNTIME_KEYS = {"name", "version"}
_GPU_KEYS = {"vendor", "model", "memoryMiB", "features"}
_GPU_OPTIONAL = {"count"}


def _fail(field: str, message: str) -> ProtocolError:
    return ProtocolError("capabilities_invalid", message, field)


def _exact_keys(
    doc: Any, allowed: set[str], field: str | None, optional: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise _fail(field or "capabilities", "must be an object")
    unknown = sorted((key for key in doc if key not in allowed and key not in optional), key=display_key)
    if unknown:
        raise _fail(join_path(field, display_key(unknown[0])), "unknown field")
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
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise _fail(join_path(field, index), f"duplicate entry {name!r}")
        seen.add(name)
    return sorted(names)


def normalise_arch(value: Any, field: str = "arch") -> str:
    """Canonical architecture name for ``value`` (``amd64`` -> ``x86_64``, case-insensitive).

    Raises :class:`ProtocolError` ``capabilities_invalid`` at ``field`` for anything not in
    :data:`ARCH_ALIASES` (ADR-0012 §4: architectures are compared by canonical name only).
    """
    if not isinstance(value, str) or value.lower() not in ARCH_ALIASES:
        raise _fail(field, f"unknown architecture; use one of {', '.join(sorted(ARCHITECTURES))}")
    return ARCH_ALIASES[value.lower()]


def normalise_os(value: Any, field: str = "os") -> str:
    """Canonical operating-system name (``macos`` -> ``darwin``, case-insensitive).

    Raises :class:`ProtocolError` ``capabilities_invalid`` at ``field`` for an unknown name.
    ADR-0012 §4.
    """
    if not isinstance(value, str) or value.lower() not in OS_ALIASES:
        raise _fail(field, f"unknown operating system; use one of {', '.join(sorted(OPERATING_SYSTEMS))}")
    return OS_ALIASES[value.lower()]


def is_semver(value: Any) -> bool:
    """True for an exact SemVer 2.0.0 version of at most 64 characters that node-semver parses.

    ``1.2.3``, ``2.2.0-rc.1``, ``1.0.0+build.5`` pass; ``v1.2``, ``1.2``, ``01.2.3``,
    ``1.2.3\\n`` and non-ASCII digits do not. Never raises.
    ADR-0012 §4.
    """
    if not isinstance(value, str) or len(value) > MAX_VERSION_LENGTH or not SEMVER.match(value):
        return False
    return nodesemver.valid(value, loose=False) is not None


def _runtimes(value: Any, field: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise _fail(field, "must be an array")
    if len(value) > MAX_RUNTIMES:
        raise _fail(field, f"at most {MAX_RUNTIMES} entries")
    result = []
    seen: set[str] = set()
    for index, item in enumerate(value):
        item_field = join_path(field, index)
        item = _exact_keys(item, _RUNTIME_KEYS, item_field)
        name = _name(item["name"], join_path(item_field, "name"))
        if not is_semver(item["version"]):
            raise _fail(
                join_path(item_field, "version"),
                f"must be an exact semantic version of at most {MAX_VERSION_LENGTH} characters "
                "such as 3.11.7",
            )
        if name in seen:
            raise _fail(join_path(item_field, "name"), f"duplicate runtime {name!r}")
        seen.add(name)
        result.append({"name": name, "version": item["version"]})
    return sorted(result, key=lambda r: r["name"])


def _labels(value: Any, field: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _fail(field, "must be an object")
    if len(value) > MAX_LABELS:
        raise _fail(field, f"at most {MAX_LABELS} labels")
    for key, label in value.items():
        label_field = join_path(field, display_key(key))
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise _fail(label_field, LABEL_RULE)
        if not isinstance(label, str) or not LABEL_VALUE.match(label):
            raise _fail(label_field, LABEL_RULE)
    return dict(sorted(value.items()))


def _gpus(value: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail(field, "must be an array")
    if len(value) > MAX_GPUS:
        raise _fail(field, f"at most {MAX_GPUS} entries")
    result = []
    seen: set[bytes] = set()
    devices = 0
    for index, item in enumerate(value):
        item_field = join_path(field, index)
        item = _exact_keys(item, _GPU_KEYS, item_field, _GPU_OPTIONAL)
        model = item["model"]
        if not isinstance(model, str) or not GPU_MODEL.match(model):
            raise _fail(
                join_path(item_field, "model"),
                "must be 1-64 printable ASCII characters without leading or trailing space",
            )
        gpu = {
            "vendor": _name(item["vendor"], join_path(item_field, "vendor")),
            "model": model,
            "memoryMiB": _integer(item["memoryMiB"], join_path(item_field, "memoryMiB"), 0, MAX_MEMORY_MIB),
            "features": _name_set(item["features"], join_path(item_field, "features"), MAX_GPU_FEATURES),
        }
        identity = canonical_bytes(gpu)
        if identity in seen:
            raise _fail(item_field, "duplicate GPU entry; describe identical devices once with a count")
        seen.add(identity)
        count = _integer(item.get("count", 1), join_path(item_field, "count"), 1, MAX_GPUS)
        devices += count
        if devices > MAX_GPUS:
            raise _fail(join_path(item_field, "count"), f"at most {MAX_GPUS} GPU devices in total")
        result.append({**gpu, "count": count})
    return sorted(result, key=canonical_bytes)


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of ``value``, which must already be normalised (sets sorted).

    ``value``: JSON-compatible dicts/lists/strings/ints/bools/None. Raises ``rfc8785``'s errors
    for floats it cannot represent or integers beyond ±2^53 (never reached by normalised data).
    ADR-0012 §4.
    """
    return rfc8785.dumps(value)


@dataclass(frozen=True)
class CanonicalDocument:
    """A validated, normalised document with its RFC 8785 bytes and their SHA-256 (hex).

    The one shape both capability snapshots and placement specs take once normalised; build it
    with :meth:`of`. ADR-0012 §4.
    """

    document: dict[str, Any]
    canonical: bytes
    sha256: str

    @classmethod
    def of(cls, document: dict[str, Any]) -> Self:
        """Canonicalise a normalised ``document`` (see :func:`canonical_bytes`)."""
        canonical = canonical_bytes(document)
        return cls(document, canonical, hashlib.sha256(canonical).hexdigest())

    @property
    def canonical_text(self) -> str:
        """The canonical bytes as text (ASCII), as stored in the database."""
        return self.canonical.decode("utf-8")


class CapabilitySnapshot(CanonicalDocument):
    """A worker's validated capability snapshot (stored in ``WorkerSession.capabilities``)."""


def normalise(doc: Any) -> dict[str, Any]:
    """Validate a parsed snapshot and return its normalised form (ADR-0012 §4).

    ``doc``: the parsed JSON object (see the module docstring for the shape and caps). Returns a
    new dict with aliases mapped, sets sorted and ``gpus[].count`` filled in.
    Raises :class:`ProtocolError` (``capabilities_invalid``) naming the first bad field, as a
    path inside the snapshot (``labels.zone``, ``gpus[0].memoryMiB``); never anything else.
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
    """Validate, normalise and canonicalise a parsed snapshot (ADR-0012 §2, §4).

    ``doc``: the parsed JSON object a worker registers. Returns the normalised document, its
    RFC 8785 bytes and their SHA-256 (lowercase hex). Idempotent: ``snapshot(s.document)`` gives
    the same bytes as ``s``.
    Raises :class:`ProtocolError`: ``capabilities_invalid`` with the field path, or
    ``capabilities_too_large`` (field ``capabilities``) when the canonical bytes exceed 16 KiB.
    """
    result = CapabilitySnapshot.of(normalise(doc))
    if len(result.canonical) > MAX_SNAPSHOT_BYTES:
        raise ProtocolError(
            "capabilities_too_large",
            f"canonical snapshot is {len(result.canonical)} bytes; the limit is {MAX_SNAPSHOT_BYTES}",
            "capabilities",
        )
    return result
