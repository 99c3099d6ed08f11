"""The operator console: one admin module per app whose models it shows (``docs/architecture.md``).

Django's admin autodiscovery imports this package; importing each module registers its admins.
"""

from . import accounts, audit, leases, runs, schedules, workers

__all__ = ["accounts", "audit", "leases", "runs", "schedules", "workers"]
