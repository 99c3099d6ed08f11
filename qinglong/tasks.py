"""Celery tasks: thin wrappers around services (cluster profile; beat schedule in settings)."""

from dataclasses import asdict

from celery import shared_task

from actions.sweeps import run_cycle


@shared_task(name="qinglong.tasks.sweep_cycle", ignore_result=True)
def sweep_cycle() -> dict:
    """One dispatch/sweep cycle (see actions.sweeps.run_cycle)."""
    return asdict(run_cycle())
