"""Artifacts: after the job ends, under the same run lease, the agent collects the files matching
the revision's declared globs and uploads each in parts with its SHA-256 (docs/logs.md,
Artifacts). Limits are checked here too (file count, bytes per file and in total), so an
over-limit file is reported and skipped without sending it; the control plane checks them
again and verifies the checksum."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol import globs
from protocol.messages import OutputsSpec
from protocol.wire import ARTIFACT_PART_BYTES

from .client import ApiError, TransportError

log = logging.getLogger("qinglong.agent")

Send = Callable[[Mapping[str, object]], dict[str, Any]]


@dataclass(frozen=True)
class Found:
    name: str  # relative to the work directory, "/"-separated
    path: Path
    size: int


def collect(work_dir: Path, outputs: OutputsSpec) -> tuple[list[Found], list[str]]:
    """The regular files under ``work_dir`` matching the declared globs (``protocol.globs``, the
    control plane's rule; symlinks and names with control characters skipped), within the
    declared limits; and one line per file
    left out, saying which limit it broke."""
    root = work_dir.resolve()
    seen: dict[str, Found] = {}
    for directory, subdirs, files in os.walk(root):  # symlinked directories are not followed
        subdirs.sort()
        for file_name in sorted(files):
            path = Path(directory) / file_name
            name = path.relative_to(root).as_posix()
            if not globs.matches_any(name, outputs["paths"]):
                continue
            if path.is_symlink() or not path.is_file() or globs.has_control_characters(name):
                continue  # the control plane refuses control characters in a name
            seen.setdefault(name, Found(name, path, path.stat().st_size))
    found: list[Found] = []
    skipped: list[str] = []
    total = 0
    for item in sorted(seen.values(), key=lambda f: f.name):
        if item.size > outputs["maxFileBytes"]:
            skipped.append(f"{item.name}: {item.size} bytes is over maxFileBytes {outputs['maxFileBytes']}")
        elif len(found) >= outputs["maxFiles"]:
            skipped.append(f"{item.name}: over maxFiles {outputs['maxFiles']}")
        elif total + item.size > outputs["maxTotalBytes"]:
            skipped.append(f"{item.name}: over maxTotalBytes {outputs['maxTotalBytes']}")
        else:
            found.append(item)
            total += item.size
    return found, skipped


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(ARTIFACT_PART_BYTES):
            digest.update(block)
    return digest.hexdigest()


def upload(item: Found, send: Send) -> bool:
    """Upload one file in parts of ``ARTIFACT_PART_BYTES`` (one part in memory at a time).
    True when the control plane stored it; a refusal is logged and the file skipped. Raises
    ``TransportError`` when the control plane could not be reached."""
    digest = sha256_of(item.path)
    offset = 0
    with item.path.open("rb") as handle:
        while True:
            data = handle.read(ARTIFACT_PART_BYTES)
            body = {
                "name": item.name,
                "size": item.size,
                "sha256": digest,
                "offset": offset,
                "content": base64.b64encode(data).decode("ascii"),
            }
            try:
                answer = send(body)
            except ApiError as exc:
                log.error("artifact %s refused: %s", item.name, exc)
                return False
            offset += len(data)
            if answer.get("status") in ("stored", "idempotent") and (offset >= item.size or not data):
                return True
            if not data:
                log.error("artifact %s changed while it was uploaded", item.name)
                return False


def upload_all(work_dir: Path, outputs: OutputsSpec, send: Send) -> int:
    """Collect and upload the declared artifacts; returns how many were stored."""
    found, skipped = collect(work_dir, outputs)
    for line in skipped:
        log.error("artifact not uploaded: %s", line)
    stored = 0
    for item in found:
        try:
            stored += upload(item, send)
        except TransportError as exc:
            log.error("artifact %s not uploaded, the control plane did not answer: %s", item.name, exc)
    return stored
