"""Job output endpoints (docs/logs.md): the worker's log chunks and artifact parts (signed,
fenced by the run lease), and the operator's log reads, artifact lists and downloads. Thin."""

from __future__ import annotations

from django.http import FileResponse, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response

from actions.artifacts import Part, artifact_upload
from actions.logs import Chunk, Segment, log_append
from api.base import OperatorAPIView, WorkerAPIView, represented, validated
from core.conf import output
from logs import selectors
from protocol import wire

from . import serializers as s


class OutputWorkerView(WorkerAPIView):
    """Job output has its own per-worker request bucket (``QINGLONG_RATE_OUTPUT``)."""

    rate_group = "worker-output"

    def rate(self) -> str:
        return output().rate_output


class LogAppendView(OutputWorkerView):
    """Append one chunk of a running attempt's output; an exact replay changes nothing."""

    max_body_bytes = wire.BODY_LIMITS[wire.LOG_APPEND]

    @extend_schema(request=s.LogChunkSerializer, responses={200: s.LogChunkOutSerializer})
    def post(self, request):
        data = validated(s.LogChunkSerializer, request)
        result = log_append(
            **self.lease_fence(data),
            chunk=Chunk(
                seq=data["seq"],
                segments=tuple(
                    Segment(stream=part["stream"], offset=part["offset"], data=part["content"])
                    for part in data["segments"]
                ),
            ),
        )
        out = {
            "status": result.status,
            "nextSeq": result.next_seq,
            "intervalSeconds": result.interval_seconds,
            "truncated": result.truncated,
            "storedBytes": result.stored_bytes,
        }
        return Response(represented(s.LogChunkOutSerializer, out))


class ArtifactUploadView(OutputWorkerView):
    """Upload one part of a declared artifact (in order); the last part is checksummed."""

    max_body_bytes = wire.BODY_LIMITS[wire.ARTIFACT_UPLOAD]

    @extend_schema(request=s.ArtifactPartSerializer, responses={200: s.ArtifactPartOutSerializer})
    def post(self, request):
        data = validated(s.ArtifactPartSerializer, request)
        result = artifact_upload(
            **self.lease_fence(data),
            part=Part(
                name=data["name"],
                size=data["size"],
                sha256=data["sha256"],
                offset=data["offset"],
                data=data["content"],
            ),
        )
        out = {
            "status": result.status,
            "receivedBytes": result.received_bytes,
            "artifactId": result.artifact_id,
        }
        return Response(represented(s.ArtifactPartOutSerializer, out))


LOG_HEADERS = {
    "X-Log-Next-Offset": "the `after` to ask from next (bytes of the combined log)",
    "X-Log-Complete": "true once the attempt ended: nothing more will arrive",
    "X-Log-Truncated": "true once the log reached its cap",
    "X-Log-Attempt": "the attempt number read",
}


class RunLogView(OperatorAPIView):
    """An attempt's stored log as plain text (the latest attempt unless ``attempt`` is given);
    follow a live log by asking again with ``after`` = the previous ``X-Log-Next-Offset``."""

    permissions = {"GET": "runs.view_run"}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "attempt", int, required=False, description="attempt number (default: the latest)"
            ),
            OpenApiParameter(
                "after", int, required=False, description="byte offset to read from (default 0)"
            ),
            OpenApiParameter("stream", str, required=False, enum=list(wire.LOG_STREAMS)),
        ],
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR,
                description="the log bytes; headers: "
                + "; ".join(f"{name}: {meaning}" for name, meaning in LOG_HEADERS.items()),
            )
        },
    )
    def get(self, request, run_id):
        query = validated_query(request)
        attempt = selectors.run_attempt(run_id, query.get("attempt"))
        piece = selectors.read_log(attempt, after=query["after"], stream=query.get("stream"))
        response = HttpResponse(piece.data, content_type="text/plain; charset=utf-8")
        response["X-Log-Next-Offset"] = str(piece.next_offset)
        response["X-Log-Complete"] = "true" if piece.complete else "false"
        response["X-Log-Truncated"] = "true" if piece.truncated else "false"
        response["X-Log-Attempt"] = str(attempt.number)
        response["Cache-Control"] = "no-store"
        return response


def validated_query(request) -> dict:
    serializer = s.LogQuerySerializer(data=request.query_params.dict())
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class RunArtifactListView(OperatorAPIView):
    """The stored artifacts of every attempt of a run."""

    permissions = {"GET": "runs.view_run"}

    @extend_schema(responses={200: s.ArtifactOutSerializer(many=True)})
    def get(self, request, run_id):
        return Response(s.ArtifactOutSerializer(selectors.run_artifacts(run_id), many=True).data)


class ArtifactDownloadView(OperatorAPIView):
    """Download one stored artifact (``Digest``-style ``X-Checksum-Sha256`` header)."""

    permissions = {"GET": "runs.view_run"}

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request, run_id, artifact_id: int):
        artifact = selectors.run_artifact(run_id, artifact_id)
        response = FileResponse(
            selectors.open_artifact(artifact),
            as_attachment=True,
            filename=artifact.name.rsplit("/", 1)[-1],
            content_type="application/octet-stream",
        )
        response["X-Checksum-Sha256"] = artifact.sha256
        response["Content-Length"] = str(artifact.size)
        return response
