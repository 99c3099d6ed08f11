"""Wire shapes of job output: log chunks and artifact parts (worker), log reads and artifact
lists (operator). docs/logs.md."""

from __future__ import annotations

import base64
import binascii
import re

from django.core.validators import MaxLengthValidator, ProhibitNullCharactersValidator
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from api import shapes
from api.base import StrictCharField, StrictIntegerField, StrictSerializer
from api.leases.serializers import MAX_COUNTER, LeaseFenceSerializer
from api.query import digits_value
from protocol.globs import has_control_characters
from protocol.wire import ARTIFACT_PART_BYTES, LOG_CHUNK_BYTES, LOG_STREAMS, MAX_LOG_SEGMENTS

#: Offsets and sizes stay exact in every JSON reader (2^53).
MAX_OFFSET = 2**53 - 1
SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
#: Validators DRF's CharField adds that Base64Field drops (see there).
TEXT_ONLY_VALIDATORS = (ProhibitNullCharactersValidator, ProhibitSurrogateCharactersValidator)


class Base64Field(StrictCharField):
    """Bytes as standard base64 (padding required), at most ``max_bytes`` once decoded.

    DRF runs a ``CharField``'s validators on the value ``to_internal_value`` returns — here the
    decoded bytes. Its NUL and surrogate checks format ``str(bytes)`` (the repr of up to 32 KiB,
    about 40,000 characters, which the surrogate check then walks one character at a time in
    Python: the largest single cost of parsing a log chunk) and cannot refuse anything here: NUL
    bytes are content (a job may print them; the repr never holds a raw NUL either), and a lone
    surrogate is refused by the strict JSON parser before any serializer runs (and is no base64).
    So they are not run. The length check stays (cheap, and the schema's ``maxLength``).
    """

    def __init__(self, *, max_bytes: int, **kwargs):
        self.max_bytes = max_bytes
        super().__init__(allow_blank=True, max_length=4 * ((max_bytes + 2) // 3), **kwargs)
        self.validators = [v for v in self.validators if not isinstance(v, TEXT_ONLY_VALIDATORS)]

    def run_validation(self, data=serializers.empty):
        # DRF answers a blank string with "" before to_internal_value runs: empty content is b"".
        value = super().run_validation(data)
        return b"" if value == "" else value

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise serializers.ValidationError("must be standard base64") from None
        if len(decoded) > self.max_bytes:
            raise serializers.ValidationError(f"at most {self.max_bytes} bytes")
        return decoded


@shapes.rule(Base64Field)
def _base64_rule(field: Base64Field) -> shapes.Check | None:
    # What is left of CharField's validators is the length check, which DRF runs on the decoded
    # bytes (see Base64Field): at most max_bytes, so never past max_length.
    found = shapes.validators_of(field, (MaxLengthValidator,))
    if found is None or field.trim_whitespace or not field.allow_blank:
        return None
    limit = min(field.max_bytes, found[MaxLengthValidator].limit_value) if found else field.max_bytes

    def check_base64(value):
        if type(value) is not str:
            raise shapes.Defer
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise shapes.Defer from None
        if len(decoded) > limit:
            raise shapes.Defer
        return decoded

    return check_base64


class LogSegmentSerializer(StrictSerializer):
    stream = serializers.ChoiceField(choices=list(LOG_STREAMS))
    offset = StrictIntegerField(min_value=0, max_value=MAX_OFFSET)
    content = Base64Field(max_bytes=LOG_CHUNK_BYTES)


class LogChunkSerializer(LeaseFenceSerializer):
    # One below the counter maximum: the log's next expected seq (seq + 1) must fit its column.
    seq = StrictIntegerField(min_value=1, max_value=MAX_COUNTER - 1)
    # DRF passes min_length/max_length on to the ListSerializer that many=True builds.
    segments = LogSegmentSerializer(  # type: ignore[call-arg]
        many=True, min_length=1, max_length=MAX_LOG_SEGMENTS
    )

    def validate_segments(self, value):
        total = sum(len(segment["content"]) for segment in value)
        if total > LOG_CHUNK_BYTES:
            raise serializers.ValidationError(f"at most {LOG_CHUNK_BYTES} bytes in all segments")
        return value


class LogChunkOutSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["stored", "idempotent", "truncated"])
    nextSeq = serializers.IntegerField()
    intervalSeconds = serializers.FloatField(help_text="wait this long before the next send")
    truncated = serializers.BooleanField(help_text="the log reached its cap: send no more")
    storedBytes = serializers.IntegerField()


class ArtifactNameField(StrictCharField):
    """A relative "/"-separated path: no leading "/", no "." or ".." segment, no NUL."""

    def __init__(self, **kwargs):
        super().__init__(min_length=1, max_length=300, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if has_control_characters(value):
            raise serializers.ValidationError("must not contain control characters (CR, LF, NUL, …)")
        parts = value.split("/")
        if (
            value.startswith("/")
            or "\x00" in value
            or "\\" in value
            or any(p in ("", ".", "..") for p in parts)
        ):
            raise serializers.ValidationError("must be a relative path without '.', '..' or empty segments")
        return value


class Sha256Field(StrictCharField):
    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not SHA256_HEX.match(value):
            raise serializers.ValidationError("must be 64 lowercase hex digits")
        return value


class ArtifactPartSerializer(LeaseFenceSerializer):
    name = ArtifactNameField()
    size = StrictIntegerField(min_value=0, max_value=MAX_OFFSET)
    sha256 = Sha256Field()
    offset = StrictIntegerField(min_value=0, max_value=MAX_OFFSET)
    content = Base64Field(max_bytes=ARTIFACT_PART_BYTES)


class ArtifactPartOutSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["receiving", "stored", "idempotent"])
    receivedBytes = serializers.IntegerField()
    artifactId = serializers.IntegerField()


class LogQuerySerializer(StrictSerializer):
    attempt = StrictIntegerField(min_value=1, max_value=32767, required=False)
    after = StrictIntegerField(min_value=0, max_value=MAX_OFFSET, required=False, default=0)
    stream = serializers.ChoiceField(choices=list(LOG_STREAMS), required=False)

    def to_internal_value(self, data):
        # Query strings are text: digits become integers here, anything else is refused by field.
        # An overlong or non-digit value stays text, which the integer field refuses by name.
        converted = {}
        for key, value in data.items():
            number = digits_value(value) if key in ("attempt", "after") else None
            converted[key] = value if number is None else number
        return super().to_internal_value(converted)


class ArtifactOutSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    attempt = serializers.IntegerField(source="attempt.number")
    name = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    storedAt = serializers.DateTimeField(source="stored_at")
    expiresAt = serializers.DateTimeField(source="expires_at")
