"""On PostgreSQL every lease test runs twice: with the default dispatch hold, where a claim of
fresh work is answered by the Python path (the claim ranking needs the fleet), and with no hold,
where a claim goes through ``ql_lease_claim`` whenever it can (migration leases 0004). Release
and renew take their database functions either way. So the one contract suite holds for both
paths (docs/leases.md, On PostgreSQL: one round trip). SQLite has one path and runs once.
"""

from __future__ import annotations

import pytest
from django.conf import settings

PATHS = {"postgresql": ["dispatch-hold", "no-hold"], "sqlite": ["dispatch-hold"]}


def pytest_generate_tests(metafunc):
    if "claim_path" in metafunc.fixturenames:
        vendor = "postgresql" if "postgresql" in settings.DATABASES["default"]["ENGINE"] else "sqlite"
        metafunc.parametrize("claim_path", PATHS[vendor], indirect=True)


@pytest.fixture(autouse=True)
def claim_path(request, protocol_settings) -> str:
    """Which claim path the test exercises (see the module docstring)."""
    if request.param == "no-hold":
        protocol_settings(DISPATCH_HOLD_SECONDS=0)
    return request.param
