"""Operator placement preview: which live workers would take a task revision now, and why not."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from qinglong.api.base import OperatorAPIView
from qinglong.db import db_now
from qinglong.errors import DomainError
from runs.models import TaskRevision

from ..selectors import live_workers, parse_placement, placement_preview
from .serializers import PreviewSerializer


class PlacementPreviewView(OperatorAPIView):
    @extend_schema(responses={200: PreviewSerializer})
    def get(self, request, revision_id):
        revision = TaskRevision.objects.filter(pk=revision_id).first()
        if revision is None:
            raise DomainError("revision_not_found", "no such task revision")
        placement = parse_placement(revision.placement_sha256, revision.placement)
        rows = placement_preview(placement, live_workers(now=db_now()))
        return Response(PreviewSerializer({"revisionId": revision.pk, "placement": placement, "workers": rows}).data)
