"""The control plane's own liveness and what it excuses (docs/leases.md, Outages).

Every serving process beats one shared row (``ControlPlaneBeat`` ``serving``) on the database
clock while it can serve (:func:`liveness_beat_record`, called by ``actions.liveness``). From that
row, :func:`expiry_cutoff` tells the expiry sweeps and the fences which lapses count:

* no row at all (no serving process ever beat here: a test, a bare ``manage.py sweep``): every
  lapse counts, as before;
* the control plane is not serving now (no beat for ``OUTAGE_AFTER_SECONDS``: every replica down,
  or its database or cache unreachable from them): only lapses before the last beat (less one beat
  interval: the last beat may follow the last answered request by that much) count — what lapsed
  since could not have been prevented by the worker;
* it serves again after such a gap, and the grace window (``OUTAGE_GRACE_SECONDS`` from the first
  beat after the gap) is still open: only lapses before the outage began (same margin) count;
* otherwise every lapse counts.

A session or run lease that lapsed after the cutoff is neither settled by a sweep nor refused by a
fence: a heartbeat or renewal that arrives inside the window keeps it. Once the window has passed,
the sweeps settle whatever was not renewed — a worker that is really gone is settled at most one
grace window later than without an outage.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Greatest

from audit.models import ControlPlaneBeat
from core.conf import protocol

SERVING = "serving"


def liveness_beat_record(*, now: datetime) -> bool:
    """Beat the shared liveness row at ``now`` (the database clock); True if this beat ended a gap.

    One ``UPDATE`` (an insert the first time): if the previous beat is older than
    ``OUTAGE_AFTER_SECONDS``, ``outage_began_at`` becomes that beat and ``serving_since`` becomes
    ``now`` — in the same statement, so two replicas beating at once record one outage. A gap
    that began inside the previous outage's grace window keeps that outage's start (one outage).
    """
    settings = protocol()
    gap = Q(beat_at__lt=now - timedelta(seconds=settings.outage_after_seconds))
    # A gap that began while the previous outage's grace window was still open extends that
    # outage: its lapses stay excused until the grace window after this recovery.
    in_grace = Q(outage_began_at__isnull=False) & Q(
        beat_at__lt=ExpressionWrapper(
            F("serving_since") + Value(timedelta(seconds=settings.outage_grace_seconds)),
            output_field=DateTimeField(),
        )
    )
    updated = ControlPlaneBeat.objects.filter(name=SERVING).update(
        serving_since=Case(When(gap, then=Value(now)), default=F("serving_since")),
        outage_began_at=Case(
            When(gap & in_grace, then=F("outage_began_at")),
            When(gap, then=F("beat_at")),
            default=F("outage_began_at"),
        ),
        beat_at=Greatest(F("beat_at"), Value(now)),
    )
    if not updated:
        ControlPlaneBeat.objects.bulk_create(
            [ControlPlaneBeat(name=SERVING, beat_at=now, serving_since=now)], ignore_conflicts=True
        )
        return False
    row = ControlPlaneBeat.objects.filter(name=SERVING).values_list("serving_since", flat=True).first()
    return row == now


def expiry_cutoff(now: datetime) -> datetime:
    """The latest expiry time that counts as a lapse at ``now`` (the database clock); see the module
    docstring. Sessions and run leases with an expiry after it are excused. One primary-key read."""
    row = ControlPlaneBeat.objects.filter(name=SERVING).first()
    if row is None:
        return now
    settings = protocol()
    # The last beat may follow the last answered request by up to one beat interval.
    margin = timedelta(seconds=settings.liveness_beat_seconds)
    if now - row.beat_at > timedelta(seconds=settings.outage_after_seconds):
        return min(now, row.beat_at - margin)
    if row.outage_began_at is not None and now < row.serving_since + timedelta(
        seconds=settings.outage_grace_seconds
    ):
        return min(now, row.outage_began_at - margin)
    return now


def lapse_excused(expires_at: datetime, now: datetime) -> bool:
    """Whether a session or lease that expired at ``expires_at`` (≤ ``now``) is excused by an
    outage of the control plane (:func:`expiry_cutoff`); a live one needs no excuse."""
    return expires_at > now or expires_at > expiry_cutoff(now)


def liveness_state(now: datetime) -> dict[str, object]:
    """The liveness row for ``/readyz`` and operators: beat age, whether serving, the grace window."""
    row = ControlPlaneBeat.objects.filter(name=SERVING).first()
    if row is None:
        return {"beat": None}
    settings = protocol()
    grace_until = (
        row.serving_since + timedelta(seconds=settings.outage_grace_seconds)
        if row.outage_began_at is not None
        else None
    )
    return {
        "beat_age_seconds": round((now - row.beat_at).total_seconds(), 3),
        "serving": now - row.beat_at <= timedelta(seconds=settings.outage_after_seconds),
        "outage_began_at": row.outage_began_at,
        "serving_since": row.serving_since,
        "grace_open": grace_until is not None and now < grace_until,
    }
