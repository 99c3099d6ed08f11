"""Console test fixtures: users for each role, and a fleet and runs in every state, made through the
real write paths (no row is written by hand except where a lease lapse is simulated)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import Permission, User

from actions.leases.expiry import sweep_expired_leases
from actions.runs import run_cancel
from actions.sessions.shutdown import session_operator_offline
from actions.workers import worker_drain, worker_revoke
from core.db import db_now
from runs.models import Run, RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, expire_lease, start
from workers.models import WorkerSession

PASSWORD = "console-pass-1"
#: Roles until the least-privilege groups land: Django's standard model permissions.
VIEW_ONLY = ("view_",)
OPERATE = ("view_", "add_run", "change_run", "change_worker", "add_worker", "add_task", "change_task")


def make_user(role: str) -> User:
    """``admin`` (superuser), ``operator`` (view, enroll, drain, tasks, runs) or ``viewer`` (view)."""
    if role == "admin":
        return User.objects.create_superuser(role, f"{role}@example.com", PASSWORD)
    user = User.objects.create_user(role, f"{role}@example.com", PASSWORD, is_staff=True)
    wanted = OPERATE if role == "operator" else VIEW_ONLY
    apps = ("workers", "runs", "leases", "audit")
    permissions = [
        p
        for p in Permission.objects.filter(content_type__app_label__in=apps)
        if any(
            p.codename.startswith(prefix) if prefix.endswith("_") else p.codename == prefix
            for prefix in wanted
        )
    ]
    user.user_permissions.set(permissions)
    return user


def fleet_in_every_state() -> dict:
    """Workers online, draining, expired, offline, new and revoked; runs queued, running, retry
    waiting-free terminal states, cancelled and waiting with a summary. Returns them by name."""
    made: dict = {}
    online = enrolled_worker("online-1")
    online_session = register(online, max_concurrent=2)
    made["online"] = online
    drained = enrolled_worker("drained-1")
    register(drained)
    worker_drain(worker_id=drained.worker_id)
    lapsed = enrolled_worker("lapsed-1")
    lapsed_session = register(lapsed)
    WorkerSession.objects.filter(pk=lapsed_session.session_id).update(
        lease_expires_at=db_now() - timedelta(seconds=5)
    )
    gone = enrolled_worker("gone-1")
    register(gone)
    session_operator_offline(worker_id=gone.worker_id, force=True)
    made["new"] = enrolled_worker("never-1")
    revoked = enrolled_worker("revoked-1")
    register(revoked)
    worker_revoke(worker_id=revoked.worker_id)

    revision = make_revision("sample-task", command="echo hi", env={"API_TOKEN": "hunter2", "MODE": "x"})
    made["revision"] = revision
    done = enqueue(revision)
    complete(start(claim_one(online_session)), "succeeded", 0, stdout="hi\n")
    failed = enqueue(make_revision("fails", command="exit 3"))
    complete(start(claim_one(online_session)), "failed", 3)
    retrying = enqueue(make_revision("flaky", command="exit 1", max_attempts=3, retry_on=("failed",)))
    complete(start(claim_one(online_session)), "failed", 1)
    timed_out = enqueue(make_revision("slow-job", command="sleep 99"))
    complete(start(claim_one(online_session)), "timed_out", None)
    lost = enqueue(make_revision("lost-job", command="sleep 99"))
    held = start(claim_one(online_session))
    expire_lease(held.attempt_id)
    sweep_expired_leases()
    running = enqueue(revision)
    start(claim_one(online_session))
    made.update(done=done, failed=failed, retrying=retrying, timed_out=timed_out, lost=lost, running=running)
    made["queued"] = enqueue(make_revision("arm-only", placement={"required": {"arch": ["arm64"]}}))
    cancelled = enqueue(revision)
    run_cancel(run_id=cancelled.pk, reason="not needed")
    made["cancelled"] = cancelled
    made["attempt"] = RunAttempt.objects.filter(run=running).first()
    made["runs"] = list(Run.objects.all())
    return made
