"""Matching one capability snapshot against one placement: a pure function (ADR-0012 §4).

``match(snapshot, placement)`` returns either a score (the sum of the weights of the preferred
labels the worker carries) or the *first* failing category, checked in the fixed order of
:data:`CATEGORIES`. ``preferred`` only orders eligible workers; it never admits one that
``required`` rejects, and it never rejects one that ``required`` admits. Both arguments are
normalised documents (``protocol.capabilities.normalise``, ``placement.spec.normalise``);
nothing here touches the database, the clock or any global state, so equal inputs always give
equal answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import nodesemver

#: Mismatch categories, in checking order (a fixed, small set: safe for events and metrics).
CATEGORIES = ("executor", "arch", "os", "runtime", "labels", "memory", "disk", "gpu")
#: Added by candidate selection for an eligible worker without a free slot.
CAPACITY = "capacity"
#: Added by the summary for workers that are not live candidates at all: a session that is
#: draining (worker or operator), and one whose lease lapsed (swept or not yet).
DRAINING = "draining"
EXPIRED = "expired"
#: Every category a mismatch summary may hold (a fixed, small set).
SUMMARY_CATEGORIES = (*CATEGORIES, CAPACITY, DRAINING, EXPIRED)


@dataclass(frozen=True)
class Match:
    """``eligible`` with ``score`` ≥ 0, or not eligible with the first failing ``category``."""

    eligible: bool
    score: int = 0
    category: str | None = None


def satisfies(version: str, version_range: str) -> bool:
    """Whether exact SemVer ``version`` satisfies npm-style ``version_range`` (npm prerelease rule).

    Both were validated before they were stored (``protocol.capabilities.is_semver``,
    ``placement.spec.valid_range``); should the library still refuse a pair, the answer is
    "no" (a ``runtime`` mismatch), never an exception.
    ADR-0012 §4.
    """
    return _satisfies(version, version_range)


@lru_cache(maxsize=16384)
def _satisfies(version: str, version_range: str) -> bool:
    # Cached: node-semver parses the range on every call, and claims and
    # summaries ask the same (version, range) pairs over and over. Both strings are bounded (64,
    # 128 characters), so the cache is bounded too.
    try:
        return bool(nodesemver.satisfies(version, version_range, loose=False))
    except Exception:  # refuse rather than crash a claim or a summary over one odd pair
        return False


def _gpu_fits(gpus: list[dict[str, Any]], need: dict[str, Any]) -> bool:
    devices = sum(
        gpu.get("count", 1)
        for gpu in gpus
        if (need["vendor"] is None or gpu["vendor"] == need["vendor"])
        and gpu["memoryMiB"] >= need["minMemoryMiB"]
        and set(need["features"]) <= set(gpu["features"])
    )
    return devices >= need["count"]


def first_mismatch(snapshot: dict[str, Any], required: dict[str, Any]) -> str | None:
    """The first category of :data:`CATEGORIES` in which ``snapshot`` fails ``required``, or None.

    ``snapshot``: a normalised capability document; ``required``: the ``required`` part of a
    normalised placement. Checks, in order: executor offered; arch and os in the allowed lists
    (empty = any); every required runtime present with a version satisfying its range; every
    required label present with exactly that value; memory and disk at least the minimum (MiB);
    at least ``gpu.count`` GPU devices of the vendor, each with the minimum memory and every
    required feature.
    ADR-0012 §4.
    """
    if required["executor"] not in snapshot["executors"]:
        return "executor"
    if required["arch"] and snapshot["arch"] not in required["arch"]:
        return "arch"
    if required["os"] and snapshot["os"] not in required["os"]:
        return "os"
    if required["runtimes"]:
        versions = {runtime["name"]: runtime["version"] for runtime in snapshot["runtimes"]}
        for name, version_range in required["runtimes"].items():
            if name not in versions or not satisfies(versions[name], version_range):
                return "runtime"
    labels = snapshot["labels"]
    if any(labels.get(key) != value for key, value in required["labels"].items()):
        return "labels"
    if snapshot["memoryMiB"] < required["minMemoryMiB"]:
        return "memory"
    if snapshot["diskMiB"] < required["minDiskMiB"]:
        return "disk"
    if required["gpu"] is not None and not _gpu_fits(snapshot["gpus"], required["gpu"]):
        return "gpu"
    return None


def mismatches(snapshot: dict[str, Any], required: dict[str, Any]) -> tuple[str, ...]:
    """Every category of :data:`CATEGORIES` in which ``snapshot`` fails ``required``, in order.

    The same checks as :func:`first_mismatch`, without stopping at the first: a mismatch summary
    counts each failing category of each worker (``arch: 3, gpu: 2`` may both count one worker).
    ADR-0012 §4.
    """
    failing = []
    if required["executor"] not in snapshot["executors"]:
        failing.append("executor")
    if required["arch"] and snapshot["arch"] not in required["arch"]:
        failing.append("arch")
    if required["os"] and snapshot["os"] not in required["os"]:
        failing.append("os")
    if required["runtimes"]:
        versions = {runtime["name"]: runtime["version"] for runtime in snapshot["runtimes"]}
        if any(
            name not in versions or not satisfies(versions[name], version_range)
            for name, version_range in required["runtimes"].items()
        ):
            failing.append("runtime")
    labels = snapshot["labels"]
    if any(labels.get(key) != value for key, value in required["labels"].items()):
        failing.append("labels")
    if snapshot["memoryMiB"] < required["minMemoryMiB"]:
        failing.append("memory")
    if snapshot["diskMiB"] < required["minDiskMiB"]:
        failing.append("disk")
    if required["gpu"] is not None and not _gpu_fits(snapshot["gpus"], required["gpu"]):
        failing.append("gpu")
    return tuple(failing)


def score(snapshot: dict[str, Any], preferred: dict[str, Any]) -> int:
    """Sum of the weights (1–100 each) of ``preferred`` labels the snapshot carries with that value.

    0 when none match; at most 16 × 100. Used only to order eligible workers.
    ADR-0012 §4.
    """
    labels = snapshot["labels"]
    return sum(entry["weight"] for entry in preferred["labels"] if labels.get(entry["key"]) == entry["value"])


def match(snapshot: dict[str, Any], placement: dict[str, Any]) -> Match:
    """Decide whether a worker with ``snapshot`` may run a revision with ``placement`` (ADR-0012 §4).

    ``snapshot``: normalised capability document; ``placement``: normalised placement document.
    Returns ``Match(eligible=True, score=…)`` or ``Match(eligible=False, category=…)`` with the
    first failing category. Pure and deterministic; raises nothing for normalised input.
    """
    category = first_mismatch(snapshot, placement["required"])
    if category is not None:
        return Match(eligible=False, category=category)
    return Match(eligible=True, score=score(snapshot, placement["preferred"]))
