"""Domain errors with stable machine codes.

Services raise :class:`DomainError` with a code from :data:`CATALOGUE`; one DRF exception
handler (``api.exceptions``) turns it into ``{"code", "message", "field"}`` with the
catalogued HTTP status. Services never build HTTP responses. The catalogue itself lives in
``protocol.errors`` (the agent reads it too) and is re-exported here; ``docs/errors.md`` is
generated from it (``manage.py error_codes``) and a test keeps the two equal.
"""

from __future__ import annotations

from protocol.errors import CATALOGUE, ErrorSpec

__all__ = ["CATALOGUE", "DomainError", "ErrorSpec"]


class DomainError(Exception):
    """A refused request: ``code`` is a key of :data:`CATALOGUE`, ``field`` names the culprit.

    ``retry_after`` (seconds) is sent as the ``Retry-After`` header for 429/503 codes;
    ``details`` is a small dict of facts the caller needs to recover (for example the current
    session version after ``session_version_conflict``). Raises ``KeyError`` at construction for
    an uncatalogued code (a programming error).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        retry_after: int | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        self.spec = CATALOGUE[code]
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.details = details
        super().__init__(f"{code}: {message}")

    @property
    def status(self) -> int:
        return self.spec.status

    def as_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"code": self.code, "message": self.message, "field": self.field}
        if self.details:
            body["details"] = self.details
        return body
