"""The end-to-end tests' control plane keeps its port while it is stopped (``tests.agent.processes``):
an outage test stops its server for a while and starts it again on the same port, and another
checkout's server picking that port meanwhile would answer the test's agents in its place (it did:
the clean-clone CI of f22d396 failed so)."""

from __future__ import annotations

import pytest

from tests.agent.processes import ControlPlane, free_port, manage, reserve_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_stopped_control_plane_keeps_its_port_until_it_starts_again(tmp_path):
    plane = ControlPlane(tmp_path)
    plane.start()
    try:
        plane.stop()
        # Nothing listens on the port now, yet another server is refused it up front …
        stranger = manage("serve", "--port", str(plane.port), "--no-sweep", timeout=30)
        assert stranger.returncode != 0
        assert "another control plane serves it" in stranger.stderr
        # … and the tests' own port picker passes it over.
        assert reserve_port(plane.port) is None
        assert all(free_port() != plane.port for _ in range(3))
        plane.start()  # the same port, its lock handed back to the server
        assert plane.url.endswith(f":{plane.port}")
    finally:
        plane.stop()
