"""Matching one capability snapshot against one placement: a pure function (ADR-0012 §4).

``match(snapshot, placement)`` returns either a score (the sum of the weights of the preferred
labels the worker carries) or the *first* failing category, checked in the fixed order of
:data:`CATEGORIES`. ``preferred`` only orders eligible workers; it never admits one that
``required`` rejects. Both arguments are normalised documents (``protocol.capabilities``,
``placement.spec``); nothing here touches the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import nodesemver

#: Mismatch categories, in checking order. ``capacity`` is added by candidate selection.
CATEGORIES = ("executor", "arch", "os", "runtime", "labels", "memory", "disk", "gpu")
CAPACITY = "capacity"


@dataclass(frozen=True)
class Match:
    """``eligible`` with ``score`` ≥ 0, or not eligible with the first failing ``category``."""

    eligible: bool
    score: int = 0
    category: str | None = None


def _satisfies(version: str, version_range: str) -> bool:
    try:
        return bool(nodesemver.satisfies(version, version_range, loose=False))
    except Exception:  # a stored range was validated at revision time; refuse rather than crash
        return False


def _gpu_fits(gpus: list[dict[str, Any]], need: dict[str, Any]) -> bool:
    fitting = [
        gpu
        for gpu in gpus
        if (need["vendor"] is None or gpu["vendor"] == need["vendor"])
        and gpu["memoryMiB"] >= need["minMemoryMiB"]
        and set(need["features"]) <= set(gpu["features"])
    ]
    return len(fitting) >= need["count"]


def first_mismatch(snapshot: dict[str, Any], required: dict[str, Any]) -> str | None:
    """The first category in which ``snapshot`` fails ``required``, or None if it fits."""
    if required["executor"] not in snapshot["executors"]:
        return "executor"
    if required["arch"] and snapshot["arch"] not in required["arch"]:
        return "arch"
    if required["os"] and snapshot["os"] not in required["os"]:
        return "os"
    if required["runtimes"]:
        versions = {runtime["name"]: runtime["version"] for runtime in snapshot["runtimes"]}
        for name, version_range in required["runtimes"].items():
            if name not in versions or not _satisfies(versions[name], version_range):
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


def score(snapshot: dict[str, Any], preferred: dict[str, Any]) -> int:
    """Sum of the weights of ``preferred`` labels the snapshot carries with the same value."""
    labels = snapshot["labels"]
    return sum(entry["weight"] for entry in preferred["labels"] if labels.get(entry["key"]) == entry["value"])


def match(snapshot: dict[str, Any], placement: dict[str, Any]) -> Match:
    """Decide whether a worker with ``snapshot`` may run a revision with ``placement``."""
    category = first_mismatch(snapshot, placement["required"])
    if category is not None:
        return Match(eligible=False, category=category)
    return Match(eligible=True, score=score(snapshot, placement["preferred"]))
