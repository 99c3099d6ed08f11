"""The store of compacted logs and artifacts: Django's storage API, alias ``output``
(``settings.STORAGES``; the filesystem under the var dir by default, docs/logs.md)."""

from __future__ import annotations

import os

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages


def output_storage() -> Storage:
    """The configured output storage."""
    return storages["output"]


def put(name: str, data: bytes) -> str:
    """Store ``data`` under exactly ``name`` (an earlier object of that name is replaced: a write
    path that rolled back after storing leaves its object to be overwritten). Returns the name."""
    storage = output_storage()
    if storage.exists(name):
        storage.delete(name)
    return storage.save(name, ContentFile(data))


def read(name: str, start: int = 0, length: int | None = None) -> bytes:
    """Bytes ``start``…``start+length`` of a stored object (all from ``start`` when ``length`` is None)."""
    with output_storage().open(name, "rb") as handle:
        handle.seek(start)
        return handle.read() if length is None else handle.read(length)


def remove(name: str) -> None:
    """Delete a stored object if it exists."""
    if name:
        output_storage().delete(name)


def remove_empty_directory(name: str) -> None:
    """Remove the directory ``name`` of a filesystem storage when it exists and is empty (other
    storages have no directories: nothing to do)."""
    storage = output_storage()
    try:
        path = storage.path(name)
    except NotImplementedError:
        return
    try:
        os.rmdir(path)
    except OSError:  # missing or not empty
        pass
