"""Detecting this machine's capability snapshot (validated by ``protocol.capabilities``).

Architecture and OS come from ``platform``; memory from ``sysconf``; disk from the free space of
the work directory's file system; runtimes by asking ``python3``, ``node`` and ``bash`` for their
versions (coerced to exact semver: ``5.2.15(1)-release`` → ``5.2.15``); GPUs from ``nvidia-smi``
when it exists. Labels come from the command line (``--label zone=eu-1``).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from protocol.capabilities import ARCH_ALIASES, OS_ALIASES, snapshot

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
#: (runtime name, command, executor it enables)
RUNTIMES = (
    ("python", ["python3", "--version"], "python"),
    ("node", ["node", "--version"], "node"),
    ("bash", ["bash", "--version"], None),
)


def coerce_semver(text: str) -> str | None:
    """The first X.Y[.Z] in ``text`` as exact semver X.Y.Z (leading zeros dropped), or None."""
    found = _VERSION.search(text)
    if not found:
        return None
    major, minor, patch = (int(part or 0) for part in found.groups())
    return f"{major}.{minor}.{patch}"


def _probe(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return coerce_semver(done.stdout + done.stderr)


def parse_nvidia_smi(csv_text: str) -> list[dict[str, Any]]:
    """GPU entries from ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits``.

    Identical devices (same model and memory) become one entry with a ``count``, as the snapshot
    schema requires; at most 16 devices are reported (the schema's cap).
    """
    counts: dict[tuple[str, int], int] = {}
    for line in csv_text.strip().splitlines():
        name, _, memory = line.rpartition(",")
        model = re.sub(r"[^\x20-\x7e]", "", name.strip())[:64] or "unknown"
        try:
            memory_mib = int(float(memory or 0))
        except ValueError:
            continue
        if sum(counts.values()) < 16:
            counts[(model, memory_mib)] = counts.get((model, memory_mib), 0) + 1
    return [
        {"vendor": "nvidia", "model": model, "memoryMiB": memory_mib, "features": ["cuda"], "count": count}
        for (model, memory_mib), count in sorted(counts.items())
    ]


def _gpus() -> list[dict[str, Any]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(done.stdout)


def detect(*, work_dir: Path, labels: dict[str, str], features: list[str] | None = None) -> dict[str, Any]:
    """Build this machine's snapshot (not yet validated)."""
    executors = ["shell"] if shutil.which("sh") else []
    runtimes = []
    for name, command, executor in RUNTIMES:
        version = _probe(command)
        if version is not None:
            runtimes.append({"name": name, "version": version})
            if executor:
                executors.append(executor)
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    work_dir.mkdir(parents=True, exist_ok=True)
    machine = platform.machine().lower()
    system = platform.system().lower()
    return {
        "arch": ARCH_ALIASES.get(machine, machine),
        "os": OS_ALIASES.get(system, system),
        "executors": executors,
        "runtimes": runtimes,
        "labels": dict(labels),
        "memoryMiB": page * pages // (1024 * 1024),
        "diskMiB": shutil.disk_usage(work_dir).free // (1024 * 1024),
        "cpuCount": os.cpu_count() or 1,
        "gpus": _gpus(),
        "features": sorted(set(features or [])),
    }


def detect_valid(
    *, work_dir: Path, labels: dict[str, str], features: list[str] | None = None
) -> dict[str, Any]:
    """Detect and validate (raises protocol.errors.ProtocolError naming the bad field)."""
    return snapshot(detect(work_dir=work_dir, labels=labels, features=features)).document
