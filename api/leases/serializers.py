"""Wire shapes of the run lease endpoints (claim, ACKs, renew, release, complete)."""

from __future__ import annotations

from rest_framework import serializers

from actions.leases.activation import START_FAILURES
from actions.leases.completion import OUTCOMES, CompletionResult
from actions.leases.next_claim import NextClaim
from api import shapes
from api.base import StrictCharField, StrictIntegerField, StrictSerializer, StrictUUIDField
from api.workers.serializers import FenceSerializer, SessionOutSerializer
from leases.fence import AckResult
from leases.models import RunDispatchLease
from leases.offers import Offer
from leases.tokens import TOKEN
from protocol import messages, wire
from protocol.wire import (
    MAX_CLAIM_WAIT_SECONDS,
    MAX_OFFERS_PER_CLAIM,
    MAX_WATCHED_ATTEMPTS,
    OUTPUT_TAIL_BYTES,
)


class LeaseTokenField(StrictCharField):
    """A worker-generated fencing token: base64url, 22–128 characters (≥128 bits)."""

    def __init__(self, **kwargs):
        super().__init__(min_length=22, max_length=128, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not TOKEN.match(value):
            raise serializers.ValidationError("must be base64url of at least 128 bits")
        return value


@shapes.rule(LeaseTokenField)
def _token_rule(field: LeaseTokenField) -> shapes.Check | None:
    return shapes.refined_text_check(field, TOKEN.match)


class OfferRequestSerializer(StrictSerializer):
    offerId = StrictUUIDField()
    leaseToken = LeaseTokenField()


class ClaimSerializer(FenceSerializer):
    # DRF passes min_length/max_length on to the ListSerializer that many=True builds; the stubs'
    # BaseSerializer.__init__ does not list them.
    offers = OfferRequestSerializer(  # type: ignore[call-arg]
        many=True, min_length=1, max_length=MAX_OFFERS_PER_CLAIM
    )


#: Lease generations and versions are stored as 32-bit integers; a larger number names no lease.
MAX_COUNTER = 2**31 - 1


class LeaseFenceSerializer(FenceSerializer):
    attemptId = StrictUUIDField()
    leaseGeneration = StrictIntegerField(min_value=1, max_value=MAX_COUNTER)
    leaseToken = LeaseTokenField()


class VersionedLeaseSerializer(LeaseFenceSerializer):
    leaseVersion = StrictIntegerField(min_value=0, max_value=MAX_COUNTER)


class AckSerializer(VersionedLeaseSerializer):
    offerId = StrictUUIDField()


class RunningAckSerializer(AckSerializer):
    pid = StrictIntegerField(min_value=1, max_value=2**31 - 1)
    pgid = StrictIntegerField(min_value=1, max_value=2**31 - 1, required=False, allow_null=True)
    executorHandle = StrictCharField(max_length=512)


class StartFailedSerializer(AckSerializer):
    reason = serializers.ChoiceField(choices=sorted(START_FAILURES))


class TailField(StrictCharField):
    """A bounded output tail: at most OUTPUT_TAIL_BYTES of UTF-8, no NUL."""

    def __init__(self, **kwargs):
        super().__init__(allow_blank=True, required=False, default="", trim_whitespace=False, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        # A lone surrogate is counted as UTF-8 would write it, then refused by its validator.
        if len(value.encode("utf-8", "surrogatepass")) > OUTPUT_TAIL_BYTES:
            raise serializers.ValidationError(f"at most {OUTPUT_TAIL_BYTES} bytes of UTF-8")
        return value


@shapes.rule(TailField)
def _tail_rule(field: TailField) -> shapes.Check | None:
    # Four bytes a character at most: only a long tail needs encoding to be measured.
    return shapes.refined_text_check(
        field,
        lambda text: len(text) * 4 <= OUTPUT_TAIL_BYTES or len(text.encode("utf-8")) <= OUTPUT_TAIL_BYTES,
    )


class NextClaimSerializer(StrictSerializer):
    """A completion's claim for the slot it frees (docs/leases.md, "The next claim")."""

    offers = OfferRequestSerializer(  # type: ignore[call-arg]
        many=True, min_length=1, max_length=MAX_OFFERS_PER_CLAIM
    )


class CompleteSerializer(LeaseFenceSerializer):
    sequence = StrictIntegerField(min_value=1, max_value=2**31 - 1)
    outcome = serializers.ChoiceField(choices=list(OUTCOMES))
    exitCode = StrictIntegerField(min_value=-255, max_value=255, allow_null=True)
    stdoutTail = TailField()
    stderrTail = TailField()
    next = NextClaimSerializer(
        required=False,
        help_text="claim work for the slot this attempt frees, once the completion is recorded",
    )


class LeaseOutSerializer(serializers.Serializer):
    attemptId = serializers.UUIDField()
    offerId = serializers.UUIDField()
    leaseGeneration = serializers.IntegerField()
    leaseVersion = serializers.IntegerField()
    expiresAt = serializers.DateTimeField()
    renewIntervalSeconds = serializers.IntegerField()


class OfferOutSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["claimed", "idempotent"])
    lease = LeaseOutSerializer()
    execution = serializers.JSONField(help_text="qinglong/execution-spec@v1")


class ClaimOutSerializer(serializers.Serializer):
    offers = OfferOutSerializer(many=True)
    pollAfterSeconds = serializers.FloatField(help_text="when to ask again if no offer came back")


class AckOutSerializer(serializers.Serializer):
    status = serializers.CharField()
    lease = LeaseOutSerializer()
    cancelRequested = serializers.BooleanField()


class RefusalOutSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="an error code of the catalogue (docs/errors.md)")
    message = serializers.CharField()
    field = serializers.CharField(required=False, help_text="the culprit, as the request names it")
    details = serializers.DictField(required=False, help_text="as the error's own answer has them")


class NextClaimOutSerializer(serializers.Serializer):
    offers = OfferOutSerializer(many=True)
    refused = RefusalOutSerializer(
        required=False, help_text="the claim was refused (the completion stands): why"
    )


class CompleteOutSerializer(serializers.Serializer):
    attemptId = serializers.UUIDField()
    leaseGeneration = serializers.IntegerField()
    sequence = serializers.IntegerField()
    outcome = serializers.CharField()
    next = NextClaimOutSerializer(required=False, help_text="present when the request had ``next``")


# --- answers ---------------------------------------------------------------------------------
# Built as the wire has them (ids as text, times ``protocol.wire.timestamp``): what the output
# serializers above, which document them, would write with UTC active, for a fraction of their
# CPU on the calls every attempt makes (docs/performance.md, "Signed HTTP";
# tests/api/test_answers.py keeps the two equal).


def lease_out(lease: RunDispatchLease, renew_interval_seconds: int) -> messages.Lease:
    """A run lease as ``LeaseOutSerializer`` documents it."""
    return {
        "attemptId": str(lease.attempt_id),
        "offerId": str(lease.offer_id),
        "leaseGeneration": lease.lease_generation,
        "leaseVersion": lease.version,
        "expiresAt": wire.timestamp(lease.expires_at),
        "renewIntervalSeconds": renew_interval_seconds,
    }


def offer_out(offer: Offer) -> messages.Offer:
    """One claimed or replayed offer, as ``OfferOutSerializer`` documents it."""
    return {
        "status": offer.status,
        "lease": lease_out(offer.lease, offer.renew_interval_seconds),
        "execution": offer.execution,  # type: ignore[typeddict-item]  # the spec, a JSON object
    }


def claim_out(offers: list[Offer], poll_after_seconds: float) -> messages.ClaimAnswer:
    """The claim's answer, as ``ClaimOutSerializer`` documents it."""
    return {"offers": [offer_out(offer) for offer in offers], "pollAfterSeconds": float(poll_after_seconds)}


def ack_out(result: AckResult) -> messages.AckAnswer:
    """The answer to starting, running, start-failed, renew and release (``AckOutSerializer``)."""
    return {
        "status": result.status,
        "lease": lease_out(result.lease, result.renew_interval_seconds),
        "cancelRequested": result.cancel_requested,
    }


def complete_out(result: CompletionResult, next_claim: NextClaim | None = None) -> messages.CompleteAnswer:
    """The completion's answer, with what its next claim answered when it carried one
    (``CompleteOutSerializer``)."""
    answer: messages.CompleteAnswer = {
        "attemptId": str(result.attempt_id),
        "leaseGeneration": result.lease_generation,
        "sequence": result.sequence,
        "outcome": result.outcome,
    }
    if next_claim is not None:
        answer["next"] = {"offers": [offer_out(offer) for offer in next_claim.offers]}
        refused = next_claim.refused
        if refused is not None:
            refusal: messages.Refusal = {"code": refused.code, "message": refused.message}
            if refused.field:
                refusal["field"] = f"next.{refused.field}"  # where the offers are in this request
            if refused.details:
                refusal["details"] = refused.details
            answer["next"]["refused"] = refusal
    return answer


class WaitSecondsField(serializers.FloatField):
    """Seconds as a JSON number (integer or fraction; no strings or booleans)."""

    def to_internal_value(self, data):
        if type(data) not in (int, float):
            self.fail("invalid")
        return super().to_internal_value(data)


class ClaimWaitSerializer(FenceSerializer):
    """The waiting claim (docs/leases.md "Waiting claims"): offers may be empty (a watch only)."""

    offers = OfferRequestSerializer(  # type: ignore[call-arg]
        many=True, max_length=MAX_OFFERS_PER_CLAIM, allow_empty=True
    )
    watch = serializers.ListField(
        child=StrictUUIDField(), max_length=MAX_WATCHED_ATTEMPTS, required=False, default=list
    )
    waitSeconds = WaitSecondsField(min_value=0, max_value=MAX_CLAIM_WAIT_SECONDS)


class ClaimWaitOutSerializer(serializers.Serializer):
    offers = OfferOutSerializer(many=True)
    cancelRequested = serializers.ListField(child=serializers.UUIDField())
    waitSeconds = serializers.FloatField(help_text="the wait the server granted")
    ended = serializers.ChoiceField(
        choices=["offers", "cancel", "session", "timeout", "shutdown", "superseded"]
    )
    session = SessionOutSerializer()
