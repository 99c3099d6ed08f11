"""The part of the heartbeat benchmark (bench/heartbeat.py) that imports Django models: workers
and their enrollment tokens, made through the services. Imported once ``django.setup()`` has run.
"""

from __future__ import annotations

from actions.enrollment import enrollment_token_create, worker_create


def issue_tokens(count: int, tag: str) -> list[str]:
    """``count`` new workers named ``bench-hb-<tag>-<i>``; the enrollment token of each."""
    tokens = []
    for index in range(count):
        worker = worker_create(name=f"bench-hb-{tag}-{index}", actor="bench")
        tokens.append(enrollment_token_create(worker_id=worker.pk).token)
    return tokens
