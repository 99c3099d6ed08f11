"""Run lease endpoints (``/api/v1/worker/claim`` and ``/api/v1/worker/lease/…``): thin adapters."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from actions.leases.activation import lease_running, lease_start_failed, lease_starting
from actions.leases.claims import OfferRequest, lease_claim
from actions.leases.completion import Completion, lease_complete
from actions.leases.next_claim import lease_complete_and_claim
from actions.leases.renewal import lease_release, lease_renew
from api.base import WorkerAPIView, validated
from core.conf import protocol
from protocol import wire

from . import serializers as s


class ClaimView(WorkerAPIView):
    """Claim runnable attempts: each offer carries the worker's own offer id and lease token."""

    max_json_depth = 3

    @extend_schema(request=s.ClaimSerializer, responses={200: s.ClaimOutSerializer})
    def post(self, request):
        data = validated(s.ClaimSerializer, request)
        offers = lease_claim(
            **self.session_fence(data),
            offers=[OfferRequest(o["offerId"], o["leaseToken"]) for o in data["offers"]],
        )
        return Response(s.claim_out(offers, protocol().claim_poll_seconds))


class StartingView(WorkerAPIView):
    """Starting ACK: the worker accepted the offer (attempt claimed → starting)."""

    @extend_schema(request=s.AckSerializer, responses={200: s.AckOutSerializer})
    def post(self, request):
        data = validated(s.AckSerializer, request)
        result = lease_starting(
            **self.lease_fence(data), offer_id=data["offerId"], lease_version=data["leaseVersion"]
        )
        return Response(s.ack_out(result))


class RunningView(WorkerAPIView):
    """Running ACK: the executor owns the process (attempt and run → running)."""

    @extend_schema(request=s.RunningAckSerializer, responses={200: s.AckOutSerializer})
    def post(self, request):
        data = validated(s.RunningAckSerializer, request)
        result = lease_running(
            **self.lease_fence(data),
            offer_id=data["offerId"],
            lease_version=data["leaseVersion"],
            pid=data["pid"],
            pgid=data.get("pgid"),
            executor_handle=data["executorHandle"],
        )
        return Response(s.ack_out(result))


class StartFailedView(WorkerAPIView):
    """The attempt could not (or must not) start: end it in one transaction."""

    @extend_schema(request=s.StartFailedSerializer, responses={200: s.AckOutSerializer})
    def post(self, request):
        data = validated(s.StartFailedSerializer, request)
        result = lease_start_failed(
            **self.lease_fence(data),
            offer_id=data["offerId"],
            lease_version=data["leaseVersion"],
            reason=data["reason"],
        )
        return Response(s.ack_out(result))


class RenewView(WorkerAPIView):
    """Renew a started attempt's lease (CAS on the lease version); answers cancellation requests."""

    @extend_schema(request=s.VersionedLeaseSerializer, responses={200: s.AckOutSerializer})
    def post(self, request):
        data = validated(s.VersionedLeaseSerializer, request)
        result = lease_renew(**self.lease_fence(data), lease_version=data["leaseVersion"])
        return Response(s.ack_out(result))


class ReleaseView(WorkerAPIView):
    """Hand back an attempt that has not started."""

    @extend_schema(request=s.VersionedLeaseSerializer, responses={200: s.AckOutSerializer})
    def post(self, request):
        data = validated(s.VersionedLeaseSerializer, request)
        result = lease_release(**self.lease_fence(data), lease_version=data["leaseVersion"])
        return Response(s.ack_out(result))


class CompleteView(WorkerAPIView):
    """Report the attempt's result; an identical resend is an exact replay. With ``next``, claim
    work for the slot it frees once the result is recorded (docs/leases.md, "The next claim")."""

    max_body_bytes = wire.BODY_LIMITS[wire.LEASE_COMPLETE]

    @extend_schema(request=s.CompleteSerializer, responses={200: s.CompleteOutSerializer})
    def post(self, request):
        data = validated(s.CompleteSerializer, request)
        completion = Completion(
            sequence=data["sequence"],
            outcome=data["outcome"],
            exit_code=data["exitCode"],
            stdout_tail=data["stdoutTail"],
            stderr_tail=data["stderrTail"],
        )
        if "next" not in data:
            return Response(s.complete_out(lease_complete(**self.lease_fence(data), completion=completion)))
        result, next_claim = lease_complete_and_claim(
            **self.lease_fence(data),
            completion=completion,
            offers=[OfferRequest(o["offerId"], o["leaseToken"]) for o in data["next"]["offers"]],
        )
        return Response(s.complete_out(result, next_claim))
