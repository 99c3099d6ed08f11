"""The one error type of the protocol package (no Django here: the agent imports this package)."""

from __future__ import annotations


class ProtocolError(ValueError):
    """Input that breaks the wire protocol.

    ``code`` is one of the stable codes of ``qinglong.errors.CATALOGUE`` (for example
    ``json_duplicate_key`` or ``capabilities_invalid``); ``field`` is a dotted path into the
    document (``labels.region``, ``gpus[1].memoryMiB``) or ``None`` for the whole body.
    """

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        self.code = code
        self.message = message
        self.field = field
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))


def join_path(parent: str | None, key: str | int) -> str:
    """``join_path("gpus", 1) == "gpus[1]"``; ``join_path("labels", "zone") == "labels.zone"``."""
    if isinstance(key, int):
        return f"{parent or ''}[{key}]"
    return f"{parent}.{key}" if parent else key
