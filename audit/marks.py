"""When the sweep cycle last finished (``SweepMark``): written by the cycle, read by ``/readyz``."""

from __future__ import annotations

from datetime import timedelta

from django.db.models.functions import Now

from audit.models import SweepMark
from core.db import db_now

CYCLE = "cycle"


def sweep_mark_record(*, duration_seconds: float) -> None:
    """Upsert the ``cycle`` row with the database's ``now()`` (one autocommit statement)."""
    updated = SweepMark.objects.filter(name=CYCLE).update(
        finished_at=Now(), duration_ms=int(duration_seconds * 1000)
    )
    if not updated:
        SweepMark.objects.bulk_create(
            [SweepMark(name=CYCLE, finished_at=db_now(), duration_ms=int(duration_seconds * 1000))],
            ignore_conflicts=True,
        )


def sweep_mark_age() -> timedelta | None:
    """How long ago (database clock) a cycle last finished; None if none ever did."""
    finished = SweepMark.objects.filter(name=CYCLE).values_list("finished_at", flat=True).first()
    return None if finished is None else db_now() - finished
