"""One control-plane replica for tests/schedules/test_replicas.py, as its own process.

``python -m tests.schedules.replica READY GO``: sets up Django against ``DATABASE_URL``, touches
READY, waits for GO to exist, then runs the schedule admission step of the sweep cycle until it
finds nothing to decide three times running, and prints ``{"decided": N}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
django.setup()

from actions.schedules import sweep_due_schedules  # noqa: E402 (needs django.setup() first)


def main() -> int:
    ready, go = Path(sys.argv[1]), Path(sys.argv[2])
    ready.touch()
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            return 2
        time.sleep(0.005)
    decided, idle = 0, 0
    while idle < 3:
        made = sweep_due_schedules(batch=3)  # small batches, so the replicas interleave
        decided += made
        idle = 0 if made else idle + 1
        time.sleep(0.01 if not made else 0)
    print(json.dumps({"decided": decided}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
