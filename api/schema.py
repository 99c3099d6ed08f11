"""OpenAPI 3 generation (drf-spectacular): security schemes and the error answers of every view.

The schema is served at ``/api/v1/schema`` (YAML; ``?format=json`` for JSON) and committed as
``docs/openapi.yaml``; ``tests/api/test_openapi.py`` fails when the two drift apart
(regenerate with ``manage.py spectacular --file docs/openapi.yaml``).

* Worker endpoints declare the three RFC 9421 headers that go together (``Signature``,
  ``Signature-Input``, ``Content-Digest``; the profile is in ``protocol.signing`` and
  docs/transport.md). Operator endpoints declare the staff token and session schemes; the
  authenticator that refuses worker signatures there contributes no scheme.
* The capability snapshot, a free JSON field to DRF, is described by the JSON Schema of its
  wire shape, built from the limits of ``protocol.capabilities`` (which stays the authority:
  it also canonicalises, checks exact semver and the 16 KiB canonical size).
* Every operation lists the error statuses it can answer, each with the one error body
  ``{"code", "message", "field", "details"?}`` of ``api.exceptions``, so a client (and
  the schemathesis fuzz run, tests/api/test_fuzz.py) can hold every answer to the schema.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from rest_framework import serializers

from core.errors import CATALOGUE
from protocol import capabilities as caps

SIGNATURE_DOC = "docs/transport.md"


class ErrorSerializer(serializers.Serializer):
    """Every refused request: a stable code, a human message, and the offending field's path."""

    code = serializers.ChoiceField(
        choices=sorted(CATALOGUE), help_text="stable machine code (`manage.py error_codes` lists them)"
    )
    message = serializers.CharField(help_text="for humans; not stable")
    field = serializers.CharField(allow_null=True, help_text="path of the offending field, or null")
    details = serializers.DictField(required=False, help_text="facts the caller needs to recover")


#: Error statuses by kind of endpoint, with what each means there.
_COMMON = {
    "400": "malformed input: JSON, a field (named in `field`) or Content-Length",
    "413": "the body exceeds this endpoint's limit (checked before parsing)",
    "406": "the Accept header admits no application/json answer (`field` names it)",
    "415": "the body is not application/json",
    "503": "storage busy or a lock timed out; retry (see Retry-After)",
}
WORKER_ERRORS = {
    **_COMMON,
    "401": "signature missing, malformed, stale, invalid, replayed, or a refused credential",
    "403": "a body/path worker or session id that is not the authenticated worker's (principal_mismatch)",
    "404": "unknown session or lease for this worker",
    "409": "fenced: superseded, expired, offline, draining session; lease or version conflicts",
    "422": "capabilities or slots out of bounds",
    "429": "rate limited (per worker, or failed authentications per address); see Retry-After",
}
ENROLL_ERRORS = {
    **_COMMON,
    "401": "enrollment token unknown, used, expired or for another worker (refusals are audited)",
    "403": "the worker is revoked",
    "429": "too many enrollment attempts from this address; see Retry-After",
}
OPERATOR_ERRORS = {
    **_COMMON,
    "401": "no API token or console session, or the token is unknown, expired or revoked",
    "403": "the user or the token's role lacks the permission (named in `message`), or a worker signature",
    "404": "no such task, revision, run, schedule, worker or session",
    "409": "the run or worker cannot make this transition now (retrying a live run), or the schedule changed",
    "422": "the placement spec breaks its schema",
}
ERROR_TABLES = {"worker": WORKER_ERRORS, "enroll": ENROLL_ERRORS, "operator": OPERATOR_ERRORS}


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's schema plus the error answers of each kind of view, request bodies of
    strict serializers marked ``additionalProperties: false`` (they refuse unknown keys), and the
    length bounds of nested lists (``many=True`` with ``min_length``/``max_length``/
    ``allow_empty``, which DRF checks but drf-spectacular does not carry) as ``minItems``/``maxItems``."""

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False
        return schema

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if isinstance(field, serializers.ListSerializer) and schema.get("type") == "array":
            minimum = field.min_length if field.min_length is not None else (0 if field.allow_empty else 1)
            if minimum:
                schema["minItems"] = minimum
            if field.max_length is not None:
                schema["maxItems"] = field.max_length
        return schema

    def _error_table(self) -> dict[str, str]:
        # Each API base class names its table (``api.base``); the schema module imports no view,
        # since DRF loads it while the view classes are being defined.
        return ERROR_TABLES.get(getattr(self.view, "error_table", ""), {})

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for status, meaning in self._error_table().items():
            if status in responses:
                continue
            response = self._get_response_for_code(ErrorSerializer, status, direction=direction)
            response["description"] = meaning
            if status in ERROR_HEADERS:
                response["headers"] = ERROR_HEADERS[status]
            responses[status] = response
        return dict(sorted(responses.items()))


#: Headers some error answers carry (documented, not required: a 503 lock timeout has none).
_RETRY_AFTER = {
    "Retry-After": {"schema": {"type": "integer", "minimum": 1}, "description": "seconds to wait"}
}
ERROR_HEADERS = {
    "401": {
        "WWW-Authenticate": {"schema": {"type": "string"}, "description": "the scheme to authenticate with"}
    },
    "429": _RETRY_AFTER,
    "503": _RETRY_AFTER,
}


class WorkerSignatureScheme(OpenApiAuthenticationExtension):
    """RFC 9421 HTTP Message Signatures, Ed25519: three headers that always go together."""

    target_class = "api.auth.WorkerSignatureAuthentication"
    name = ["workerSignature", "workerSignatureInput", "workerContentDigest"]

    def get_security_definition(self, auto_schema):
        profile = (
            "RFC 9421 HTTP Message Signature with the worker's Ed25519 key, label `ql`, covering "
            '`("@method" "@path" "@query" "content-digest")` with parameters created, keyid (the '
            f'credential id), alg="ed25519", nonce and tag="qinglong-worker-v1". See {SIGNATURE_DOC}.'
        )
        return [
            {"type": "apiKey", "in": "header", "name": "Signature", "description": profile},
            {"type": "apiKey", "in": "header", "name": "Signature-Input", "description": profile},
            {
                "type": "apiKey",
                "in": "header",
                "name": "Content-Digest",
                "description": "RFC 9530 `sha-256=:<base64>:` of the exact body bytes.",
            },
        ]


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Operator API tokens (django-rest-knox, digest-only storage): ``Authorization: Token qlops_…``."""

    target_class = "api.base.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": (
                "`Token <token>`: an operator API token (named, role-scoped, expiring; shown once when "
                "created; docs/operators.md)."
            ),
        }


class RefuseWorkerSignatureScheme(OpenApiAuthenticationExtension):
    """The operator views' guard against worker signatures authenticates nobody: no scheme."""

    target_class = "api.base.RefuseWorkerSignature"
    name: list[str] = []

    def get_security_requirement(self, auto_schema):
        return None

    def get_security_definition(self, auto_schema):
        return []


def _pattern(regex) -> str:
    return "^" + regex.pattern.removesuffix("\\Z") + "$"


#: The official SemVer 2.0.0 expression (semver.org); the server checks with node-semver, strict.
SEMVER = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def capabilities_schema() -> dict:
    """JSON Schema (OpenAPI 3.0 dialect) of a capability snapshot, from protocol.capabilities."""
    name = {"type": "string", "pattern": _pattern(caps.NAME)}

    def names(limit: int, minimum: int = 0) -> dict:
        return {"type": "array", "items": name, "maxItems": limit, "minItems": minimum, "uniqueItems": True}

    def integer(low: int, high: int) -> dict:
        return {"type": "integer", "minimum": low, "maximum": high}

    properties = {
        "arch": {"type": "string", "enum": sorted(caps.ARCH_ALIASES)},
        "os": {"type": "string", "enum": sorted(caps.OS_ALIASES)},
        "executors": names(caps.MAX_EXECUTORS, 1),
        "runtimes": {
            "type": "array",
            "maxItems": caps.MAX_RUNTIMES,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "version"],
                "properties": {
                    "name": name,
                    "version": {"type": "string", "maxLength": 64, "pattern": SEMVER},
                },
            },
        },
        "labels": {
            "type": "object",
            "maxProperties": caps.MAX_LABELS,
            "additionalProperties": {"type": "string", "pattern": _pattern(caps.LABEL_VALUE)},
        },
        "memoryMiB": integer(0, caps.MAX_MEMORY_MIB),
        "diskMiB": integer(0, caps.MAX_DISK_MIB),
        "cpuCount": integer(1, caps.MAX_CPU_COUNT),
        "gpus": {
            "type": "array",
            "maxItems": caps.MAX_GPUS,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["vendor", "model", "memoryMiB", "features"],
                "properties": {
                    "vendor": name,
                    "model": {"type": "string", "pattern": _pattern(caps.GPU_MODEL)},
                    "memoryMiB": integer(0, caps.MAX_MEMORY_MIB),
                    "features": names(caps.MAX_GPU_FEATURES),
                },
            },
        },
        "features": names(caps.MAX_FEATURES),
    }
    return {
        "type": "object",
        "description": (
            "Capability snapshot (ADR-0012 §4): strict, canonicalised (RFC 8785) and digested by the "
            f"server; at most {caps.MAX_SNAPSHOT_BYTES} bytes canonical. Label keys match "
            f"{_pattern(caps.LABEL_KEY)}. Architecture and OS aliases are normalised."
        ),
        "additionalProperties": False,
        "required": sorted(properties),
        "properties": properties,
    }


class CapabilitiesFieldSchema(OpenApiSerializerFieldExtension):
    """The registration's ``capabilities`` field: its wire shape instead of "any JSON"."""

    target_class = "api.workers.serializers.CapabilitiesField"

    def map_serializer_field(self, auto_schema, direction):
        return capabilities_schema()
