"""Operator placement endpoints: a revision's preview and a run's candidate pages (ADR-0012 §4)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from api.base import OperatorAPIView
from core.db import db_now
from core.errors import DomainError
from placement.selectors import (
    decode_cursor,
    encode_cursor,
    live_workers,
    parse_placement,
    placement_preview,
    run_candidates,
)
from runs.models import TaskRevision

from .serializers import CandidatePageSerializer, PreviewSerializer


class PlacementPreviewView(OperatorAPIView):
    """Which live workers would take a run of this revision now, and each other's mismatch category."""

    http_method_names = ["get", "options"]
    permissions = {"GET": "runs.view_taskrevision"}

    @extend_schema(responses={200: PreviewSerializer})
    def get(self, request, revision_id):
        pinned = (
            TaskRevision.objects.filter(pk=revision_id)
            .values_list("pk", "placement_sha256", "placement")
            .first()
        )
        if pinned is None:
            raise DomainError("revision_not_found", "no such task revision")
        revision_pk, placement = pinned[0], parse_placement(pinned[1], pinned[2])
        preview = placement_preview(placement, live_workers(now=db_now()))
        return Response(
            PreviewSerializer(
                {
                    "revisionId": revision_pk,
                    "placement": placement,
                    "liveWorkers": preview.live_workers,
                    "eligible": preview.eligible,
                    "summary": preview.summary,
                    "workers": preview.rows,
                    "truncated": preview.truncated,
                }
            ).data
        )


class RunCandidatesView(OperatorAPIView):
    """One page (≤ 64) of the live workers that could take this run now, best first. Not a claim."""

    http_method_names = ["get", "options"]
    permissions = {"GET": "runs.view_run"}

    @extend_schema(
        parameters=[
            OpenApiParameter("after", str, required=False, description="nextAfter of the previous page")
        ],
        responses={200: CandidatePageSerializer},
    )
    def get(self, request, run_id):
        after = request.query_params.get("after")
        cursor = decode_cursor(after) if after is not None else None
        page = run_candidates(run_id=run_id, now=db_now(), after=cursor)
        return Response(
            CandidatePageSerializer(
                {
                    "runId": run_id,
                    "candidates": page.candidates,
                    "nextAfter": encode_cursor(page.next_after) if page.next_after is not None else None,
                }
            ).data
        )
