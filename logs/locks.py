"""Row locks of the job output (docs/logs.md). The worker and run rows are locked first
(``workers/locks.py`` order: worker → run → attempt → lease → attempt log → artifact)."""

from __future__ import annotations

import uuid
from datetime import datetime

from .models import Artifact, ArtifactState, AttemptLog


def lock_attempt_log(attempt_id: uuid.UUID) -> AttemptLog | None:
    """Lock and return the attempt's log row, or None if it has none."""
    return AttemptLog.objects.select_for_update().filter(pk=attempt_id).first()


def lock_artifact(artifact_id: int) -> Artifact | None:
    """Lock and return one artifact row, or None if it is gone."""
    return Artifact.objects.select_for_update().filter(pk=artifact_id).first()


def lock_expired_artifacts(attempt_id: uuid.UUID, now: datetime) -> list[Artifact]:
    """Lock and return the attempt's artifacts whose retention ended by ``now`` and that were not
    expired yet (an expired stored artifact keeps its row with an empty ``storage_name``)."""
    return list(
        Artifact.objects.select_for_update()
        .filter(attempt_id=attempt_id, expires_at__lte=now)
        .exclude(state=ArtifactState.STORED, storage_name="")
    )
